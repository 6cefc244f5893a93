"""Build a tiny random Qwen2 model and an offline-trained BPE tokenizer in DIR (about 300 KB, 7 s).

Usage: python make_tiny_model.py DIR   (needs torch, tokenizers, transformers: the venv from ./setup)
"""

import os, sys, json
import torch
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast, Qwen2Config, AutoModelForCausalLM

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
VOCAB = 1024
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=VOCAB,
    special_tokens=special,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
)
corpus = [
    "hello world, this is a tiny test corpus for a tiny model.",
    "The quick brown fox jumps over the lazy dog.",
    "SGLang serves language models fast. Hello again!",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
] * 20
import random

rng = random.Random(0)
corpus += [
    " ".join(
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
        for _ in range(50)
    )
    for _ in range(400)
]
tok.train_from_iterator(corpus, trainer)
n = tok.get_vocab_size()
hf_tok = PreTrainedTokenizerFast(
    tokenizer_object=tok,
    eos_token="<|endoftext|>",
    pad_token="<|endoftext|>",
    bos_token=None,
    unk_token=None,
)
hf_tok.chat_template = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
hf_tok.model_max_length = 2048
hf_tok.save_pretrained(out)

eos = hf_tok.convert_tokens_to_ids("<|endoftext|>")
cfg = Qwen2Config(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    bos_token_id=eos,
    eos_token_id=eos,
    torch_dtype="bfloat16",
)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
model.save_pretrained(out)
assert n == VOCAB, (n, VOCAB)
print("tokenizer vocab", n, "model vocab", VOCAB, "eos", eos, "->", os.listdir(out))
