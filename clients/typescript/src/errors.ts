/** Every error of the package descends from {@link PtelError}; each names the parameter and its valid range. */

/** Each class names itself (`override readonly name`): a minifier renames classes, so `new.target.name` would not do. */
export class PtelError extends Error {
  override readonly name: string = "PtelError";
}

/** The spec document is malformed, altered (fingerprint mismatch), or asks for something this client cannot do. */
export class SpecError extends PtelError {
  override readonly name: string = "SpecError";
  /** Where in the document: e.g. `metrics.theme.prob`. */
  readonly path: string;
  constructor(path: string, reason: string) {
    super(`spec ${path} ${reason}`);
    this.path = path;
  }
}

/** A raw event that does not fit its metric. The message names the metric, the parameter and the rule, never the value. */
export class EventError extends PtelError {
  override readonly name: string = "EventError";
  readonly metric: string;
  readonly parameter: string;
  constructor(metric: string, parameter: string, reason: string) {
    super(`metric ${JSON.stringify(metric)}: ${parameter} ${reason}`);
    this.metric = metric;
    this.parameter = parameter;
  }
}

/** A metric name that is not in the spec. */
export class UnknownMetricError extends EventError {
  override readonly name: string = "UnknownMetricError";
  constructor(metric: string, known: readonly string[]) {
    super(metric, "metric", `is not in the spec (its metrics: ${known.join(", ")})`);
  }
}

/** A bad argument to a function of this package (not an event): names the parameter and the valid range. */
export class ParameterError extends PtelError {
  override readonly name: string = "ParameterError";
  readonly parameter: string;
  constructor(parameter: string, reason: string) {
    super(`${parameter} ${reason}`);
    this.parameter = parameter;
  }
}

/** The device secret cannot be created or read, or is stored unsafely (the message never holds the key). */
export class SecretError extends PtelError {
  override readonly name: string = "SecretError";
}

/** The persisted quota cannot be read or is missing beside an existing secret: refuse to send (fail closed). */
export class QuotaStateError extends PtelError {
  override readonly name: string = "QuotaStateError";
}

/** A value that cannot be put on the wire (a metric name, an integer out of its width). */
export class WireError extends PtelError {
  override readonly name: string = "WireError";
  readonly reason: string;
  constructor(reason: string, detail: string) {
    super(`${reason}: ${detail}`);
    this.reason = reason;
  }
}
