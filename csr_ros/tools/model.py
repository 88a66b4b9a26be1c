"""`csr-ros model prepare`: convert the embedded default once, so later loads take seconds."""

from __future__ import annotations

import argparse

from csr_ros.model_store import DEFAULT_MODEL, model_fingerprint, resolve_model_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["prepare", "path"],
                        help="prepare: convert (once) and print the model directory; "
                             "path: print the directory of the tokenizer only")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="'smollm2' (embedded default), a .gguf file or a model directory")


def run(args: argparse.Namespace) -> int:
    model_dir = resolve_model_dir(args.model, weights=args.action == "prepare")
    print(f"{model_dir} fingerprint={model_fingerprint(model_dir) if args.action == 'prepare' else '-'}")
    return 0
