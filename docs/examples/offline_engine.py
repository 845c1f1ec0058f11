"""Generate offline with the engine, no server: greedy completions of a few prompts.

    python docs/examples/offline_engine.py --model DIR [--prompt TEXT ...] [--max-tokens 24]

DIR is a Hugging Face model folder or a folder with a GGUF file (`inferfleet-runtime demo-model --out DIR` makes the
built-in one).
"""

from __future__ import annotations

import argparse
import sys

from inferfleet_runtime.engine import LLMEngine, SamplingParams


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, metavar="DIR")
    parser.add_argument("--prompt", action="append", dest="prompts", metavar="TEXT")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    prompts = args.prompts or ["Beautiful is better than", "Explicit is better than"]
    engine = LLMEngine.from_model_dir(args.model)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for prompt, output in zip(prompts, engine.generate(prompts, params)):
        print(f"{prompt!r} -> {output.outputs[0].text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
