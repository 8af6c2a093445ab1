"""The root Redis fixtures start a real server, give each test a clean database, and restart."""

from __future__ import annotations

import redis


def test_redis_url_is_a_real_clean_server(redis_url):
    """Guards the clean-db promise: a key left by an earlier test is gone."""
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.dbsize() == 0
        client.set("tenure:test:left-over", "1")
        assert client.get("tenure:test:left-over") == b"1"
    finally:
        client.close()


def test_redis_url_flushes_between_tests(redis_url):
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.get("tenure:test:left-over") is None
    finally:
        client.close()


def test_private_server_restarts_on_the_same_port(redis_process_factory):
    """Fault tests rely on stop() killing the server and start() bringing it back on its port."""
    server = redis_process_factory()
    port = server.port
    client = redis.Redis.from_url(server.url, socket_timeout=1)
    try:
        client.set("k", "v")
        server.stop()
        assert not server.running
        try:
            client.ping()
            raise AssertionError("ping succeeded against a killed server")
        except redis.ConnectionError:
            pass
        server.start()
        assert server.port == port
        assert client.ping()
        # Persistence is off: a crash loses everything, like a non-persistent Redis.
        assert client.get("k") is None
    finally:
        client.close()
