/**
 * @ptel/client: privatize on the device, byte-compatible with the Python client (browser entry; the Node entry
 * adds file stores). Public API -- stable; additions only.
 */

export { DeviceClient, type Admitted, type BatchResult, type DeviceClientOptions, type Refused } from "./client.js";
export { EventError, ParameterError, PtelError, QuotaStateError, SecretError, SpecError, UnknownMetricError, WireError } from "./errors.js";
export { blake2b, blake2s, type Blake2Options } from "./hash/blake2.js";
export { sha256 } from "./hash/sha256.js";
export { shake256 } from "./hash/shake256.js";
export { canonicalJson, parseJsonTree, pythonFloatRepr, JsonNumber, type JsonTree } from "./json.js";
export { makePrivatizers, Privatizer, privatizerOf, type Payload, type Report } from "./privatize.js";
export { ContributionLimiter, KEPT_WINDOWS, type QuotaStore, type Refusal } from "./quota.js";
export { CryptoRandom, cryptoRandom, type RandomSource } from "./random.js"; // the ...ForTests sources: Node entry only
export { BoolRandomizedResponse, KaryRandomizedResponse, LocalHashing, packBits, UnaryEncoding } from "./randomizers.js";
export { bloomIndices, cohortOf, prrContext, prrThresholds, RapporEncoder, type RapporConfig, type RapporVariant } from "./rappor.js";
export { ClientSecret, SECRET_BYTES } from "./secret.js";
export {
  CollectionSpec,
  metricFingerprint,
  DEFAULT_RETRY_HORIZON_S,
  FORWARD_DELAY_BOUND_S,
  SPEC_DOCUMENT_FORMAT,
  type Bins,
  type BoolMetric,
  type CategoricalMetric,
  type KeyedMetric,
  type Metric,
  type PayloadKind,
  type RapporMetric,
  type RegressionMetric,
} from "./spec.js";
export { type Erasable, IndexedDbStore, MemoryStore, type SecretStore } from "./storage.js";
export { encodeBatch, encodeReport, MAX_BATCH_REPORTS, MAX_MESSAGE_BYTES, WIRE_VERSION } from "./wire.js";
export {
  DEFAULT_MAX_EPSILON,
  GatewayClient,
  type GatewayClientOptions,
  localEpsilon,
  type Queued,
  type SendOutcome,
  type SendResult,
} from "./gateway_client.js";
export {
  type DropReason,
  type EnumerableStorage,
  type FlushResult,
  LocalStorageQueueStore,
  MemoryQueueStore,
  type QueuedMessage,
  type QueueStats,
  type QueueStore,
  SendQueue,
  type SendQueueOptions,
} from "./queue.js";
export { type Attempt, GatewayRefusedError, GatewayTransport, idempotencyAge, MAX_SPEC_BYTES, newIdempotencyKey, type OutgoingMessage, type TransportOptions } from "./transport.js";
