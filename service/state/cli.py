"""``tenure state migrate-keys``: move a deployment's keys to or from the hash-tagged layout."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis

    from tenure.service.settings import Settings

__all__ = ["configure"]


def configure(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="state_command", metavar="COMMAND")
    migrate = commands.add_parser(
        "migrate-keys",
        help="rename every key of TENURE_REDIS_PREFIX on TENURE_REDIS_URL into another layout",
    )
    migrate.add_argument(
        "--to",
        choices=("hash-tag", "plain"),
        required=True,
        help="hash-tag: {prefix}:... (Redis Cluster); plain: prefix:... (the old layout)",
    )
    migrate.add_argument("--dry-run", action="store_true", help="count, change nothing")
    migrate.set_defaults(func=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    import redis

    from tenure.service.cli import UsageError
    from tenure.service.settings import SettingsError, load_settings
    from tenure.service.state.migrate import migrate_keys

    try:
        settings = load_settings(dev_mode=True)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    if settings.redis_cluster:
        raise UsageError("migrate on a single server (RENAME cannot cross cluster slots)")
    client = _client(settings)
    try:
        report = migrate_keys(
            client, settings.redis_prefix, to_hash_tag=args.to == "hash-tag", dry_run=args.dry_run
        )
    except redis.RedisError as exc:
        raise UsageError(f"Redis: {exc}") from None
    finally:
        client.close()
    verb = "would rename" if args.dry_run else "renamed"
    print(f"{verb} {report.renamed} keys ({report.records_rewritten} session records rewritten)")
    for name in report.conflicts:
        print(f"skipped {name}: the target name exists already")
    return 1 if report.conflicts else 0


def _client(settings: Settings) -> redis.Redis:
    import redis
    from redis.sentinel import Sentinel

    from tenure.service.settings_values import parse_sentinels

    url = settings.redis_url.get_secret_value()
    if not settings.redis_sentinels:
        return redis.Redis.from_url(url, socket_timeout=10)
    # The master the Sentinels name, with the URL's database and credentials.
    base = redis.Redis.from_url(url)
    kwargs = base.connection_pool.connection_kwargs
    base.close()
    # redis-py 8 types Sentinel, earlier releases (pyproject allows >= 5) do not: called
    # through Any, mypy strict passes on either without a version-bound ignore.
    sentinel_type: Any = Sentinel
    sentinel = sentinel_type(list(parse_sentinels(settings.redis_sentinels)), socket_timeout=10)
    master: redis.Redis = sentinel.master_for(
        settings.redis_sentinel_master,
        db=kwargs.get("db", 0),
        username=kwargs.get("username"),
        password=kwargs.get("password"),
        socket_timeout=10,
    )
    return master
