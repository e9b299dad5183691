"""A pytest plugin (copied into kafka-python's test tree by run_suite.py)
that points kafka-python's own broker fixture at rokka's listeners instead of
spawning a Kafka: `KafkaFixture.instance(transport=...)` answers with
rokka's plaintext, SASL_PLAINTEXT or SSL listener. The suite's tests that need
a broker of their own (test_sasl_integration, test_ssl_integration) then run
unchanged against rokka.

Environment (set by run_suite.py): ROKKA_PLAINTEXT, ROKKA_SASL_PLAINTEXT,
ROKKA_SSL (host:port each), ROKKA_SSL_DIR (holds `ca-cert`, the CA the SSL
listener's certificate is signed by, as the fixture's own gen_ssl_resources
names it), ROKKA_LOG (the broker's log, named when a test dumps logs)."""
import os


class _Child:
    """What the tests call on a spawned broker's process: its logs."""

    def dump_logs(self):
        print(f"rokka's log: {os.environ.get('ROKKA_LOG', '?')}")


def _rokka_broker(fixtures):
    class RokkaBroker(fixtures.KafkaFixture):
        # KafkaFixture's own __init__ prepares a Kafka installation; the
        # attributes its client helpers (_enrich_client_params,
        # sasl_enabled, ssl_enabled, bootstrap_server) read are set here.
        def __init__(self, transport="PLAINTEXT", sasl_mechanism=None, partitions=4, replicas=1, **_ignored):
            self.transport = transport.upper()
            self.sasl_mechanism = sasl_mechanism.upper() if sasl_mechanism else None
            assert self.sasl_enabled == (self.sasl_mechanism is not None), "SASL transport needs a mechanism"
            address = os.environ.get(f"ROKKA_{self.transport}")
            if not address:
                raise RuntimeError(f"rokka serves no {self.transport} listener here")
            self.host, port = address.rsplit(":", 1)
            self.port = int(port)
            self.partitions, self.replicas = partitions, replicas
            self.ssl_dir = os.environ.get("ROKKA_SSL_DIR") if self.ssl_enabled else None
            self.zookeeper = None
            self.child = _Child()
            self.running = True
            self.external = True

        def start(self):
            pass

        def open(self):
            pass

        def close(self):
            pass

        def get_topic_names(self):
            from kafka import KafkaAdminClient

            with KafkaAdminClient(**self._enrich_client_params({}, client_id="rokka_topic_lister")) as admin:
                return admin.list_topics()

    return RokkaBroker


def pytest_configure(config):
    from test.integration import fixtures

    broker = _rokka_broker(fixtures)

    def instance(cls, broker_id, **params):
        for spawn_only in ("zookeeper", "zk_chroot", "host", "port", "external", "auto_create_topic", "tmp_dir"):
            params.pop(spawn_only, None)
        return broker(**params)

    fixtures.KafkaFixture.instance = classmethod(instance)
