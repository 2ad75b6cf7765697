"""`agentsweep images`: pin the shipped images by digest (``lock``), or print one tag's digest (``resolve``).

``lock`` asks each image's registry for the manifest digest of every image the sweep configs name by
tag (agentsweep.images.registry) and writes configs/images.lock.yaml when a pin is new, moved or gone;
a registry that gives no digest for one of them leaves the lock as it was (exit 2, every failure named).
``resolve`` prints the digest one image's tag has now (the pyxis launcher records it beside the squash
file it imports).
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from agentsweep.errors import ConfigError, InputError
from agentsweep.images.registry import RegistryAnswer, mirror_map, resolve_all


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    lock = sub.add_parser("lock", help="resolve every shipped image tag and write configs/images.lock.yaml")
    lock.add_argument(
        "--config-dir",
        type=Path,
        default=None,
        help="the sweep configs' directory (default: the repo's configs/)",
    )
    resolve = sub.add_parser("resolve", help="print the manifest digest an image's tag has now")
    resolve.add_argument("image", help="repo:tag, as a config writes it")
    for each in (lock, resolve):
        each.add_argument(
            "--mirror",
            action="append",
            default=[],
            metavar="REGISTRY=HOST",
            help="ask HOST for the images of REGISTRY (docker.io=127.0.0.1:5000); repeatable",
        )


def _mirrors(pairs: list[str]) -> dict[str, str]:
    try:
        return mirror_map(pairs)
    except ValueError as err:
        raise InputError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    if args.action == "resolve":
        found = asyncio.run(resolve_all([args.image], _mirrors(args.mirror)))[args.image]
        if isinstance(found, RegistryAnswer):
            raise InputError(f"{args.image}: {found}")
        print(found)
        return 0
    return lock(args.config_dir, _mirrors(args.mirror))


def lock(config_dir: Path | None, mirrors: dict[str, str]) -> int:
    from agentsweep.config.image_lock import lock_path, read_lock, shipped_images, write_lock
    from agentsweep.config.loader import display_path, repo_root

    if config_dir is None:
        root = repo_root()
        if root is None:
            raise ConfigError("configs/: not found (run inside the repository, or pass --config-dir)")
        config_dir = root / "configs"
    if not config_dir.is_dir():
        raise ConfigError(f"{config_dir}: not a directory of sweep configs")
    path = lock_path(config_dir)
    old = read_lock(path)
    images = shipped_images(config_dir)
    found = asyncio.run(resolve_all([s.image for s in images], mirrors))
    failures = [
        f"{s.image} ({', '.join(s.where)}): {found[s.image]}"
        for s in images
        if isinstance(found[s.image], RegistryAnswer)
    ]
    if failures:
        more = f" (and {len(failures) - 1} more, above)" if len(failures) > 1 else ""
        for line in failures[1:]:
            print(f"images lock: {line}", flush=True)
        raise InputError(f"{failures[0]}{more}; {display_path(path)} left as it was")
    pins = {s.image: str(found[s.image]) for s in images}
    for image, digest in sorted(pins.items()):
        before = old.get(image)
        change = "unchanged" if before == digest else ("new" if before is None else f"moved from {before}")
        print(f"{image} {digest} ({change})")
    for image in sorted(set(old) - set(pins)):
        print(f"{image}: no config names it any more; its pin goes")
    if pins != old:
        write_lock(path, pins)
        print(f"wrote {display_path(path)} ({len(pins)} images)")
    else:
        print(f"{display_path(path)}: up to date ({len(pins)} images)")
    return 0
