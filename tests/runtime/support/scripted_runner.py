"""A scripted stand-in model runner: each prompt gets its scripted continuation, one token per character."""

from inferfleet_runtime.engine.sequence import Logprob

EOS = 0


class CharTokenizer:
    """One token per character (token id = code point); EOS (0) decodes to nothing."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i != EOS)


class ScriptedRunner:
    """Answers each prompt with its scripted continuation, and checks every batch the engine sends."""

    def __init__(self, scripts: dict[str, str], num_kv_blocks=64, block_size=4, max_len=256):
        self.tokenizer = CharTokenizer()
        self.scripts = {tuple(ord(c) for c in p): [ord(c) for c in out] for p, out in scripts.items()}
        self.model_name, self.vocab_size, self.eos_token_ids = "scripted", 0x110000, [EOS]
        self.max_position_embeddings, self.num_kv_blocks, self.block_size = max_len, num_kv_blocks, block_size
        self.num_steps = 0
        self.slots_seen: dict[int, tuple[int, int]] = {}

    def execute(self, batch):
        self.num_steps += 1
        written = set()
        results = []
        for i, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            end = seq.num_computed_tokens + num_new
            assert len(seq.block_ids) * self.block_size >= end, "block table does not cover the context"
            for pos in range(seq.num_computed_tokens, end):
                slot = seq.block_ids[pos // self.block_size] * self.block_size + pos % self.block_size
                assert slot not in written, "two tokens of one step write the same slot"
                written.add(slot)
            if not batch.samples(i):
                results.append(None)
                continue
            script = self.scripts[tuple(seq.prompt_token_ids)]
            k = seq.num_output_tokens
            token = script[k] if k < len(script) else EOS
            results.append((token, Logprob(token, -0.5, ((token, -0.5),)) if seq.params.logprobs is not None else None))
        return results
