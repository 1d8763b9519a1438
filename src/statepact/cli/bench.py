"""``statepact bench``: throughput of every protocol, held against floors measured beside it.

Scenarios, on each backing asked for (docs/benchmarks.md#scenarios):

- the three transaction scenarios: ``--concurrency`` agents each committing ``--ops``
  times on its own key; the same on ONE hot key with no backoff between retries;
  read-only commits;
- the state store's ``get_run``, ``put_run`` and ``patch_run`` of each caller's own run,
  and ``patch_run`` of one run every caller shares, with ``--concurrency`` callers;
- the queue's ``enqueue`` and claim+ack cycles with 1 and 10 workers;
- ``enqueue_many`` of the whole batch in one call, a ``Worker`` (concurrency 10) draining
  it, and the enqueue-to-handler-start latency of an idle ``Worker`` (p50 and p99 of 20
  items, its fallback poll beside them);
- the queue's lifecycle: ``stats()`` with no finished items and with ``--finished`` of
  them (p50, p99 and their ratio), and the latency from ``cancel`` to the handler's stop
  in an idle ``Worker`` (p50, p99 and max of 20 items);
- claim cost with the queue holding ``--queued`` items spread over ``--tenants`` tenants
  (each size pair with tenants <= items).

Right after each scenario, at its concurrency and on the same client, it measures the
floors that scenario is held against (``cli/_bench/targets.py``): the minimal
transaction designs beside the transaction scenarios, raw calls of the same shape
beside the state calls, the backing's write floor beside the rest; each result is
printed as ops/s, as its ratio to each floor and, where one is asked, beside its target.
On a server it also counts the round trips sent per operation (``cli/_bench/measure.py``).

The parts live in ``cli/_bench/``; this module is the command: options, the run over
the backings, the output. It must never touch data outside the namespace the bench
created, and never print a DSN in clear.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from dataclasses import asdict
from typing import TextIO

from statepact.cli._bench.floors import FLOOR_TABLE
from statepact.cli._bench.measure import MIN_SECONDS, RoundTrips
from statepact.cli._bench.report import BenchResult, Progress, format_table, targets_met
from statepact.cli._bench.scenarios import BenchParams, Runner
from statepact.cli._common import (
    URL_ENV,
    CommandError,
    add_debug_argument,
    add_server_arguments,
    environment_url,
    open_backings,
    option_url,
    run_command,
)
from statepact.clock import SystemClock
from statepact.queue import QueuePolicy

__all__ = [
    "FLOOR_TABLE",
    "MIN_SECONDS",
    "BenchParams",
    "BenchResult",
    "Progress",
    "RoundTrips",
    "add_arguments",
    "command",
    "format_table",
    "run_bench",
]

DESCRIPTION = """\
Measure statepact on the backings asked for: the transaction scenarios
(independent keys, one hot key without backoff, read-only commits), the state
store's get/put/patch under concurrent callers, the queue's enqueue and
claim+ack with 1 and 10 workers, a Worker, stats() with and without finished
items, cancel-to-handler-stop latency, and claim cost as tenants and queued
items grow. Right after each scenario it measures, on the same server, the
floors it is held against (minimal transaction designs, raw calls of the same
shape, a raw write) and prints every result as ops/s, as a ratio to each floor
and beside its target. On a server the bench works in a namespace of its own
and removes it afterwards.
"""

BACKINGS = ("memory", "redis", "postgres")


def steps_per_backing(params: BenchParams) -> int:
    # One step per recorded result: 3 tx + 4 state + 4 queue + 3 worker + 3 lifecycle + 1
    # per claim-cost cell.
    return 3 + 4 + 4 + 3 + 3 + len(params.claim_cells)


async def run_bench(
    params: BenchParams,
    urls: dict[str, str | None],
    *,
    progress: Progress,
) -> tuple[list[BenchResult], list[BenchResult], dict[str, str]]:
    """Every scenario on every backing in ``params``: results, floor samples, where each ran."""
    results: list[BenchResult] = []
    floors: list[BenchResult] = []
    where: dict[str, str] = {}
    for kind in params.backings:
        tag = f"bench{uuid.uuid4().hex[:8]}"
        async with open_backings(
            kind,
            urls.get(kind),
            clock=SystemClock(),
            policy=QueuePolicy(),
            tag=tag,
            notes=progress.stream,
            # A floor's callers each hold a connection; the backing keeps a few of its own.
            connections=params.concurrency + 10,
        ) as b:
            where[kind] = b.where
            measured, samples = await Runner(b, params, progress, tag).run_all()
            results.extend(measured)
            floors.extend(samples)
    return results, floors, where


# -- command line -----------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(_positive(part) for part in text.split(",") if part.strip())


def _backings(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in BACKINGS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown backing {', '.join(unknown) or '(none)'}; choose from {', '.join(BACKINGS)}"
        )
    return tuple(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``statepact bench``."""
    parser.add_argument(
        "--backend",
        type=_backings,
        default=None,
        metavar="LIST",
        help="comma-separated backings to measure: memory, redis, postgres (default: memory, "
        "plus each server given by --redis/--postgres)",
    )
    add_server_arguments(parser, verb="measure on")
    parser.add_argument(
        "--concurrency",
        type=_positive,
        default=40,
        metavar="N",
        help="concurrent agents/callers in the transaction and state scenarios (default 40)",
    )
    parser.add_argument(
        "--ops",
        type=_positive,
        default=10,
        metavar="N",
        help="operations per caller (default 10: 40 agents x 10 commits); the queue "
        "scenarios move concurrency x ops items",
    )
    parser.add_argument(
        "--tenants",
        type=_sizes,
        default=(10, 10_000),
        metavar="LIST",
        help="tenant counts for the claim-cost scenario, comma-separated (default 10,10000)",
    )
    parser.add_argument(
        "--queued",
        type=_sizes,
        default=(100, 100_000),
        metavar="LIST",
        help="queued-item counts for the claim-cost scenario, comma-separated (default "
        "100,100000); pairs with more tenants than items are skipped",
    )
    parser.add_argument(
        "--claims",
        type=_positive,
        default=200,
        metavar="N",
        help="claim+ack cycles timed in each claim-cost cell (default 200)",
    )
    parser.add_argument(
        "--finished",
        type=_positive,
        default=20_000,
        metavar="N",
        help="done items in the queue for the second stats() cell (default 20000; "
        "--finished 1000000 is issue 33's cell); filled untimed, pruned afterwards",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the results as JSON instead of a table"
    )
    add_debug_argument(parser)


def params_from(args: argparse.Namespace) -> BenchParams:
    """The bench's parameters; ``args.redis`` / ``args.postgres`` become the URLs of the
    servers measured: the option's, else (a bare option, or a server --backend names)
    the one of ``STATEPACT_*_URL``. The environment alone adds no backing."""
    for kind in ("redis", "postgres"):
        setattr(args, kind, option_url(getattr(args, kind), kind))
    backings: tuple[str, ...] = args.backend or (
        "memory",
        *(("redis",) if args.redis else ()),
        *(("postgres",) if args.postgres else ()),
    )
    for kind in backings:
        if kind != "memory" and not getattr(args, kind):
            setattr(args, kind, environment_url(kind))
        if kind != "memory" and not getattr(args, kind):
            raise CommandError(
                f"--backend {kind} needs --{kind} URL or {URL_ENV[kind]} (the server to "
                "measure); nothing was run"
            )
    return BenchParams(
        backings=backings,
        concurrency=args.concurrency,
        ops=args.ops,
        tenants=args.tenants,
        queued=args.queued,
        claims=args.claims,
        finished=args.finished,
    )


def command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``statepact bench`` with parsed ``args``; the exit code."""
    stream = out or sys.stdout

    async def body() -> int:
        params = params_from(args)
        urls = {"redis": args.redis, "postgres": args.postgres}
        progress = Progress(steps_per_backing(params) * len(params.backings), err)
        try:
            results, floors, where = await run_bench(params, urls, progress=progress)
        finally:
            progress.close()
        if args.json:
            payload = {
                "params": {
                    "concurrency": params.concurrency,
                    "ops": params.ops,
                    "tenants": list(params.tenants),
                    "queued": list(params.queued),
                    "claims": params.claims,
                    "finished": params.finished,
                },
                "backings": where,
                "results": [asdict(r) for r in results],
                "floors": [asdict(f) for f in floors],
            }
            print(json.dumps(payload, indent=2), file=stream)
        else:
            for kind, place in where.items():
                print(f"{kind}: {place}", file=stream)
            print(format_table(results), file=stream)
            print(
                "x floor = ops/s divided by the floor's ops/s, measured right after the "
                "scenario at the same concurrency on the same server; a row under a scenario "
                "holds it against one more floor",
                file=stream,
            )
            met, asked = targets_met(results)
            print(
                f"target = the least x floor asked for: {met} of {asked} met in this run; "
                "(peer) = a peer queue the bench does not run (docs/benchmarks.md)",
                file=stream,
            )
            print(
                "round trips/op = requests the library sent per operation in the timed part "
                "(a count, not a timing); (commit N) = those sent inside the backend's commit; "
                "- = memory, which sends none",
                file=stream,
            )
        return 0

    return run_command("bench", body, debug=args.debug, err=err)


def main(argv: list[str] | None = None) -> int:
    """``python -m statepact.cli.bench``: the bench without the rest of the command line."""
    parser = argparse.ArgumentParser(prog="statepact bench", description=DESCRIPTION)
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
