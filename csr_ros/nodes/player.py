"""Play a recorded bag onto the ROS graph with rclpy, for machines without `ros2 bag play`
(the PyPI wheels have no rosbag2): `csr-ros replay BAG --play`.

Each message is published as its recorded bytes (CDR, as rosbag2 stores it) on its topic with
its recorded type, at its bag time scaled by `--rate`; `--clock` also publishes /clock so nodes
with use_sim_time follow the bag. Topics whose type is not installed here (types defined only
in the bag, or packages the wheels lack) are skipped and named.
"""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from csr_ros.errors import ConfigError


@dataclass(frozen=True)
class PlayOptions:
    rate: float = 1.0
    start_offset_s: float = 0.0
    delay_s: float = 0.0
    clock: bool = False
    topics: tuple[str, ...] = ()
    loop: bool = False            # from the start again after the end, until stopped


def schedule(times_ns: Iterable[int], *, rate: float, start_offset_s: float = 0.0,
             ) -> Iterator[tuple[int, float]]:
    """(index, seconds after the start of playing) of each message to publish: bag times from
    the first message plus `start_offset_s`, divided by `rate`. Pure."""
    if not rate > 0:
        raise ConfigError(f"--rate must be > 0, got {rate}")
    first_ns = None
    for i, t_ns in enumerate(times_ns):
        if first_ns is None:
            first_ns = t_ns + int(start_offset_s * 1e9)
        if t_ns < first_ns:
            continue
        yield i, (t_ns - first_ns) / 1e9 / rate


def _message_class(type_name: str):
    package, kind, name = type_name.split("/")
    try:
        return getattr(importlib.import_module(f"{package}.{kind}"), name)
    except (ImportError, AttributeError):
        return None


def play(paths: list[Path], options: PlayOptions, *, log=print) -> dict:
    """Publish the bag; returns {'published': n, 'skipped_topics': {topic: type}, 'wall_s'}.

    A bag that does not exist or cannot be read is a ConfigError before rclpy starts."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise ConfigError(f"bag {', '.join(missing)} does not exist")
    for what, value_s in (("--delay", options.delay_s), ("--start-offset", options.start_offset_s)):
        if value_s < 0:
            raise ConfigError(f"{what} must be >= 0 seconds, got {value_s:g}")
    import rclpy
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rosbags.highlevel import AnyReader, AnyReaderError
    from rosbags.rosbag1 import ReaderError as Bag1Error
    from rosbags.rosbag2 import ReaderError as Bag2Error
    from rosbags.typesys import Stores, get_typestore

    rclpy.init()
    node = Node("csr_player")
    published, skipped = 0, {}
    started = time.monotonic()
    try:
        with AnyReader(paths, default_typestore=get_typestore(Stores.ROS2_JAZZY)) as reader:
            publishers = {}
            for connection in reader.connections:
                if options.topics and connection.topic not in options.topics:
                    continue
                cls = _message_class(connection.msgtype)
                if cls is None:
                    skipped[connection.topic] = connection.msgtype
                    continue
                publishers[connection.topic] = node.create_publisher(
                    cls, connection.topic,
                    QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
            for topic, type_name in sorted(skipped.items()):
                log(f"skipping {topic}: its type {type_name} is not installed here")
            if not publishers:
                raise ConfigError("none of the bag's topics has a type installed here")
            clock_pub = None
            if options.clock:
                from rosgraph_msgs.msg import Clock

                clock_pub = node.create_publisher(Clock, "/clock", 10)
            wanted = [c for c in reader.connections if c.topic in publishers]
            messages = list(reader.messages(connections=wanted))
            log(f"playing {len(messages)} messages on {len(publishers)} topics at rate "
                f"{options.rate:g}" + (f" after {options.delay_s:g} s" if options.delay_s else ""))
            while True:
                time.sleep(options.delay_s)
                t0 = time.monotonic()
                for i, at_s in schedule([t for _, t, _ in messages], rate=options.rate,
                                        start_offset_s=options.start_offset_s):
                    connection, t_ns, raw = messages[i]
                    wait_s = t0 + at_s - time.monotonic()
                    if wait_s > 0:
                        time.sleep(wait_s)
                    if clock_pub is not None:
                        msg = clock_pub.msg_type()
                        msg.clock.sec, msg.clock.nanosec = divmod(int(t_ns), 1_000_000_000)
                        clock_pub.publish(msg)
                    publishers[connection.topic].publish(bytes(raw))
                    published += 1
                if not options.loop or not messages:
                    break
                log(f"{published} messages published; from the start again (--loop)")
            time.sleep(0.5)                 # let the last messages leave
    except KeyboardInterrupt:
        log("stopped")
    except (AnyReaderError, Bag1Error, Bag2Error, OSError) as exc:   # not a readable bag
        raise ConfigError(f"cannot read the bag {', '.join(map(str, paths))}: {exc}") from None
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return {"published": published, "skipped_topics": skipped,
            "wall_s": time.monotonic() - started}


def main(argv: list[str] | None = None) -> int:
    """`python -m csr_ros.nodes.player BAG [--rate R] ...` (also `csr-ros replay BAG --play`)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bag", type=Path, nargs="+")
    add_play_arguments(parser)
    args = parser.parse_args(argv)
    return run_play(args)


def add_play_arguments(parser) -> None:
    parser.add_argument("--rate", type=float, default=1.0, help="playback rate (with --play)")
    parser.add_argument("--start-offset", type=float, default=0.0,
                        help="start this many seconds into the bag (with --play)")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="wait this many seconds before playing (with --play)")
    parser.add_argument("--clock", action="store_true",
                        help="also publish /clock from the bag times (with --play)")
    parser.add_argument("--loop", action="store_true",
                        help="play from the start again after the end, until stopped "
                             "(with --play)")


def run_play(args) -> int:
    result = play(list(args.bag), PlayOptions(
        rate=args.rate, start_offset_s=args.start_offset, delay_s=args.delay, clock=args.clock,
        topics=tuple(getattr(args, "topics", None) or ()), loop=args.loop),
        log=lambda line: print(line, file=sys.stderr))
    print(f"published {result['published']} messages in {result['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
