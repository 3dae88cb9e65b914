"""Write a tiny random-weight llama model as GGUF, for llama.cpp's server.

No model can be downloaded here, and the interop checks need none that
talks sense: only one that llama-cpp-python loads, tokenizes with, and
generates from (tools/interop.sh, tests/interop/check_llama.py). The
weights come from a fixed seed, so the same file is written every time.

Architecture "llama": 2 layers, n_embd 64, 4 heads, f32 tensors. The
tokenizer is a SentencePiece-style ("llama") vocabulary: <unk>, <s>, </s>,
the 256 byte tokens <0xNN> (byte fallback: any text tokenizes) and a few
"\u2581word" pieces; bos 1, eos 2; a plain Jinja chat template.

Usage: python interop_tiny_gguf.py OUT.gguf   (needs the gguf package)
"""

from __future__ import annotations

import sys

import gguf
import numpy as np

N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX = 64, 4, 2, 128, 512
SEED = 20240601
WORDS = ["hello", "world", "the", "a", "is", "of", "and", "to", "it", "in", "hi",
         "you", "we", "stream", "chunk", "token", "retry", "server", "yes", "no"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    scores = [0.0, 0.0, 0.0]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    # Pieces: the word-start mark alone, single letters, whole words. There
    # are no merges between them (no "he", "hel"...), so llama.cpp's
    # tokenizer reads a prompt letter by letter (bytes for the rest); the
    # words are tokens the model may generate.
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += ["\u2581" + w for w in WORDS]
    for p in pieces:
        tokens.append(p)
        scores.append(-100.0 + len(p))
        types.append(gguf.TokenType.NORMAL)
    return tokens, scores, [int(t) for t in types]


def main(out: str) -> None:
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(SEED)

    def w(*shape: int) -> np.ndarray:
        # numpy shapes are ggml's ne reversed: (rows, n_embd) is ne [n_embd, rows].
        return rng.normal(0.0, 0.3, size=shape).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    writer = gguf.GGUFWriter(out, arch="llama")
    writer.add_name("llmretry-interop-tiny")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    writer.add_tensor("token_embd.weight", w(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones.copy())
        writer.add_tensor(p + "attn_q.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(p + "attn_k.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(p + "attn_v.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(p + "attn_output.weight", w(N_EMBD, N_EMBD))
        writer.add_tensor(p + "ffn_norm.weight", ones.copy())
        writer.add_tensor(p + "ffn_gate.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_up.weight", w(N_FF, N_EMBD))
        writer.add_tensor(p + "ffn_down.weight", w(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", ones.copy())
    writer.add_tensor("output.weight", w(n_vocab, N_EMBD))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: interop_tiny_gguf.py OUT.gguf")
    main(sys.argv[1])
