"""Brokers shared by the integration tests beyond the session's plain one (``tests/conftest.py``).

``secured_broker``: ONE SASL_SSL / mutual-TLS broker (:mod:`tests.integration.secured_broker`) shared by every test
that needs one (the secured pipeline and the secured gateway): its PKI and SCRAM user are made once, and each test
uses topics of its own (unique names), so none needs a pristine broker. ``untrusted_pki``: a second CA that did not
sign the broker's certificate, for the "untrusted CA" cases. ``restartable_broker``: ONE plain broker of the
integration tests that stop and start a broker mid-test (the worker's readiness, the producer across a restart),
never the session's; each leaves it running and uses topics and groups of its own. All are made on first use only,
with package scope: shared by every test of ``tests/integration`` and stopped when the last of them is done, not kept
idle (JVMs of 512 MB heap) through the unit tests.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from ptel.kafka_broker import LocalKafka
from ptel.local_process import free_port
from tests.integration.secured_broker import Pki, SecuredBroker, make_pki, start_secured_broker


@pytest.fixture(scope="package")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    broker = start_secured_broker(tmp_path_factory.mktemp("secured-broker"))
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="package")
def untrusted_pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("other-pki"), "not-the-brokers-ca")


@pytest.fixture(scope="package")
def restartable_broker() -> Iterator[LocalKafka]:
    broker = LocalKafka(port=free_port())
    broker.start(180)
    try:
        yield broker
    finally:
        broker.stop(60)
        shutil.rmtree(broker.instance_dir, ignore_errors=True)
