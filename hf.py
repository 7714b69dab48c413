"""
The Hugging Face transformers format, both ways: GPT-2-shaped models as GPT2LMHeadModel, LLaMA-shaped ones
(RoPE, RMSNorm, SwiGLU, any GQA, tied or untied) as LlamaForCausalLM, and the tokenizer files that go with
them. transformers is optional: it is imported here, when a model is loaded or exported.

Our parameter names are GPT-2's, so GPT-2 maps by name (its Conv1D layers store weights transposed). For
LLaMA, our fused q/k/v and gate/up matrices are split into LLaMA's separate projections; our rotary layout
is already Hugging Face's (rotate-half), so no weight is permuted.
"""
import dataclasses
import os
import re
from contextlib import contextmanager

import torch

from common import UserError, read_json
from model import GPT, GPTConfig, said_one_way
from tokenizer import EOT, char_eot, decodable_ids, gpt2_encoding

PRETRAINED = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # OpenAI's GPT-2 sizes on the Hugging Face hub
EPS = 1e-5  # model.py's LayerNorm and RMSNorm epsilon
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")  # where save_pretrained puts the weights
# the files save_pretrained writes for a causal LM (config, weights whole or sharded) and its tokenizer, in
# transformers 4 and 5
FOLDER_FILES = re.compile(r"(generation_)?config\.json"  # the model's
                          r"|(tokenizer|tokenizer_config|special_tokens_map|added_tokens|vocab)\.json"  # the tokenizer's
                          r"|merges\.txt|tokenizer\.model|chat_template\.(jinja|json)"
                          r"|(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)"  # weights, whole or a shard
                          r"|(model\.safetensors|pytorch_model\.bin)\.index\.json")  # the shards' index
MASK_BUFFERS = (".attn.bias", ".attn.masked_bias")  # GPT-2's causal-mask buffers in transformers' files: no weights
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # stored (in, out)


def transformers_module():
    try:
        import transformers
    except ImportError:
        raise UserError("this needs Hugging Face transformers: pip install transformers") from None
    return transformers


@contextmanager
def no_progress_bars():
    """transformers' progress bars off for the block: in a log they are lines of control characters, and the
    scripts' own line says what was read or written."""
    from transformers.utils import logging
    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()


def hf_family(config: GPTConfig) -> str:
    """'gpt2' or 'llama': the transformers class that computes exactly what this model does, or a UserError."""
    if (config.pos_emb, config.norm, config.mlp, config.qk_norm) == ("learned", "layernorm", "gelu", False) \
            and config.kv_heads == config.n_head:
        return "gpt2"
    if (config.pos_emb, config.norm, config.mlp, config.qk_norm) == ("rope", "rmsnorm", "swiglu", False):
        return "llama"
    raise UserError(f"transformers has no model class for pos_emb={config.pos_emb}, norm={config.norm}, "
                    f"mlp={config.mlp}, n_kv_head={config.n_kv_head}, qk_norm={config.qk_norm}, "
                    f"tie_embeddings={config.tie_embeddings}: export supports GPT-2's shape (learned, layernorm, "
                    "gelu, no GQA or qk_norm) and LLaMA's (rope, rmsnorm, swiglu, no qk_norm)")


def hf_config(config: GPTConfig, special_tokens: dict):
    """The transformers config of a model of ours. special_tokens: bos/eos ids of its tokenizer."""
    tf = transformers_module()
    if hf_family(config) == "gpt2":
        # GPT-2 always has biases: a bias=False model is exported with zero biases and says so in nanogpt_bias
        return tf.GPT2Config(vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd,
                             n_layer=config.n_layer, n_head=config.n_head, n_inner=config.hidden,
                             activation_function="gelu_new", layer_norm_epsilon=EPS, resid_pdrop=0.0,
                             embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=config.tie_embeddings,
                             nanogpt_bias=config.bias, **special_tokens)
    return tf.LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.n_embd, intermediate_size=config.hidden,
                          num_hidden_layers=config.n_layer, num_attention_heads=config.n_head,
                          num_key_value_heads=config.kv_heads, head_dim=config.n_embd // config.n_head,
                          max_position_embeddings=config.block_size, rms_norm_eps=EPS, rope_theta=config.rope_theta,
                          attention_bias=config.bias, mlp_bias=config.bias, hidden_act="silu",
                          tie_word_embeddings=config.tie_embeddings, **special_tokens)


def to_hf_state(model: GPT) -> dict:
    """Our state dict renamed (and, for GPT-2, transposed; for LLaMA, split) into transformers' names."""
    config, sd = model.config, model.state_dict()
    if hf_family(config) == "gpt2":
        out = {k: (v.t() if k.endswith(CONV1D) else v).clone() for k, v in sd.items()}
        if not config.bias:  # GPT-2's layers all have biases: zeros compute what ours compute without them
            for name, module in model.named_modules():
                if name.endswith(("c_attn", "c_proj", "c_fc", "ln_1", "ln_2", "ln_f")):
                    out[f"{name}.bias"] = torch.zeros(module.weight.shape[-1] if "ln" in name else module.weight.shape[0])
        return out
    out = {theirs: sd[ours] for ours, theirs in llama_names(config)}
    for ours, theirs, sizes in llama_fused(config):
        out.update(zip(theirs, sd[ours].split(sizes)))
    return {k: v.clone() for k, v in out.items()}


def llama_names(config: GPTConfig) -> list[tuple[str, str]]:
    """(our name, LlamaForCausalLM's name) of each weight that maps one to one."""
    names = [("transformer.wte.weight", "model.embed_tokens.weight"), ("transformer.ln_f.weight", "model.norm.weight"),
             ("lm_head.weight", "lm_head.weight")]
    for i in range(config.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        names += [(ours + "ln_1.weight", theirs + "input_layernorm.weight"),
                  (ours + "ln_2.weight", theirs + "post_attention_layernorm.weight")]
        for kind in ("weight", "bias") if config.bias else ("weight",):
            names += [(ours + f"attn.c_proj.{kind}", theirs + f"self_attn.o_proj.{kind}"),
                      (ours + f"mlp.c_proj.{kind}", theirs + f"mlp.down_proj.{kind}")]
    return names


def llama_fused(config: GPTConfig) -> list[tuple[str, list[str], list[int]]]:
    """Our fused weights as (our name, LLaMA's names of its parts, the parts' sizes along dim 0): q, k, v in
    c_attn; the SwiGLU gate and up projections in c_fc."""
    hs, nkv = config.n_embd // config.n_head, config.kv_heads
    fused = []
    for i in range(config.n_layer):
        ours, theirs = f"transformer.h.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias") if config.bias else ("weight",):
            fused += [(ours + f"attn.c_attn.{kind}", [theirs + f"self_attn.{p}_proj.{kind}" for p in "qkv"],
                       [config.n_head * hs, nkv * hs, nkv * hs]),
                      (ours + f"mlp.c_fc.{kind}", [theirs + f"mlp.{p}_proj.{kind}" for p in ("gate", "up")],
                       [config.hidden, config.hidden])]
    return fused


def to_transformers(model: GPT, vocab: dict | None = None):
    """A transformers model (GPT2LMHeadModel or LlamaForCausalLM) that computes what model computes. vocab: the
    vocabulary it was trained on (as checkpoints keep it; None: GPT-2's BPE), for its bos/eos ids."""
    tf = transformers_module()
    config = hf_config(model.config, special_tokens(vocab, model.config.vocab_size))
    cls = tf.GPT2LMHeadModel if config.model_type == "gpt2" else tf.LlamaForCausalLM
    hf_model = cls(config)
    state = to_hf_state(model)
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(MASK_BUFFERS) and k != "lm_head.weight"]
    if missing or unexpected:  # a transformers version with other names: say so rather than export a broken model
        raise UserError(f"this transformers version names {cls.__name__}'s weights differently (missing "
                        f"{missing[:3]}, unexpected {unexpected[:3]}): export with transformers 4.4x or 5.x")
    decodable = decodable_ids(vocab)
    if decodable is not None and model.config.vocab_size > decodable:  # a padded vocabulary's rows decode to nothing
        hf_model.generation_config.suppress_tokens = list(range(decodable, model.config.vocab_size))
    return hf_model.eval()


def rope_theta_of(hf) -> float:
    """rope_theta of a LLaMA config, from transformers 5's rope_parameters or 4's attribute."""
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    if params.get("rope_type", params.get("type", "default")) != "default":
        raise UserError(f"this LLaMA model scales its rotary positions ({params}): only plain RoPE "
                        "is supported")
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def config_of(**args) -> GPTConfig:
    """GPTConfig(**args), from a transformers config.json: a value no model has (rope_theta 0) is one error line."""
    try:
        return GPTConfig(**args)
    except ValueError as e:
        raise UserError(f"the transformers config.json describes no model that model.py builds ({e}): it is "
                        "damaged; write it again (export.py, or save_pretrained)") from None


def from_transformers(hf_model, dropout: float = 0.0) -> GPT:
    """Our GPT with the weights of a transformers GPT2LMHeadModel or LlamaForCausalLM."""
    hf, sd = hf_model.config, hf_model.state_dict()
    if hf.model_type == "gpt2":
        scaling = {k: getattr(hf, k, default) for k, default in (("scale_attn_weights", True),
                                                                  ("scale_attn_by_inverse_layer_idx", False))}
        if hf.activation_function not in ("gelu_new", "gelu_pytorch_tanh") or hf.layer_norm_epsilon != EPS \
                or scaling != {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}:
            raise UserError(f"this GPT-2 uses activation {hf.activation_function}, layer-norm epsilon "
                            f"{hf.layer_norm_epsilon} and {scaling}: model.py computes tanh-GELU, {EPS}, and "
                            "attention scores scaled by 1/sqrt(head size) alone")
        bias = getattr(hf, "nanogpt_bias", True)
        config = config_of(block_size=hf.n_positions, vocab_size=hf.vocab_size, n_layer=hf.n_layer, n_head=hf.n_head,
                           n_embd=hf.n_embd, bias=bias, dropout=dropout, mlp_hidden=hf.n_inner or 0,
                           tie_embeddings=hf.tie_word_embeddings)  # untied: lm_head.weight is its own
        state = {k: v.t() if k.endswith(CONV1D) else v for k, v in sd.items()
                 if not k.endswith(MASK_BUFFERS)}
        if not bias:  # exported from a model without biases: they are zeros, and only then may be dropped
            if any(v.any() for k, v in state.items() if k.endswith(".bias")):
                raise UserError("this GPT-2 says nanogpt_bias=false but has non-zero biases: remove that line from "
                                "its config.json")
            state = {k: v for k, v in state.items() if not k.endswith(".bias")}
    elif hf.model_type == "llama":
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        if hf.hidden_act != "silu" or hf.rms_norm_eps != EPS or head_dim * hf.num_attention_heads != hf.hidden_size \
                or head_dim % 2 or hf.attention_bias != getattr(hf, "mlp_bias", False):
            raise UserError(f"this LLaMA model (hidden_act {hf.hidden_act}, rms_norm_eps {hf.rms_norm_eps}, head_dim "
                            f"{head_dim}, attention_bias {hf.attention_bias}) is not one model.py computes: it needs "
                            f"silu, eps {EPS}, head_dim = hidden_size / heads (even, for rotary positions) and the "
                            "same bias setting throughout")
        config = config_of(block_size=hf.max_position_embeddings, vocab_size=hf.vocab_size, n_layer=hf.num_hidden_layers,
                           n_head=hf.num_attention_heads, n_kv_head=hf.num_key_value_heads, n_embd=hf.hidden_size,
                           bias=hf.attention_bias, dropout=dropout, pos_emb="rope", rope_theta=rope_theta_of(hf),
                           norm="rmsnorm", mlp="swiglu", mlp_hidden=hf.intermediate_size,
                           tie_embeddings=hf.tie_word_embeddings)
        state = {ours: sd[theirs] for ours, theirs in llama_names(config)}
        state.update({ours: torch.cat([sd[name] for name in theirs]) for ours, theirs, _ in llama_fused(config)})
    else:
        raise UserError(f"transformers model type {hf.model_type!r} is not supported: use a GPT-2 or LLaMA model")
    config = GPTConfig(**said_one_way(dataclasses.asdict(config)))  # as a config file would say it
    model = GPT(config)
    if config.tie_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    own = model.state_dict()
    own_keys = {k for k in own if not (config.tie_embeddings and k == "lm_head.weight")}
    if set(state) != own_keys:
        raise UserError(f"the transformers weights do not fit: missing {sorted(own_keys - set(state))[:5]}, "
                        f"unexpected {sorted(set(state) - own_keys)[:5]}")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v)
    return model


def has_weights(folder: str) -> bool:
    """Whether folder holds the weights of a transformers model (in one of the files save_pretrained writes)."""
    return any(os.path.isfile(os.path.join(folder, w)) for w in WEIGHT_FILES)


def cached_copy(name: str) -> str | None:
    """The folder of the hub's local copy of the model `name` (its config and weights), or None: a model downloaded
    once loads from there, where transformers would first ask the hub for a newer copy, and on a node without
    network wait on its retries."""
    from huggingface_hub import try_to_load_from_cache
    config = try_to_load_from_cache(name, "config.json")  # a path where cached; None or a marker where not
    return os.path.dirname(config) if isinstance(config, str) and has_weights(os.path.dirname(config)) else None


def load(name: str, dropout: float = 0.0) -> GPT:
    """A GPT-2 from the hub by name (PRETRAINED), or the GPT-2 or LLaMA model in a folder that transformers'
    save_pretrained (or export.py) wrote."""
    if name not in PRETRAINED and not os.path.isdir(name):
        raise UserError(f"unknown pretrained model '{name}': use {', '.join(PRETRAINED)} or a folder saved by "
                        "transformers' save_pretrained")
    if os.path.isdir(name) and os.path.isfile(os.path.join(name, "ckpt.pt")):  # an export never holds one
        raise UserError(f"{name} is a training run's folder, not a transformers model: pass --init_from="
                        f"{os.path.join(name, 'ckpt.pt')} (or, to continue that run, --out_dir={name} --init_from=resume)")
    if os.path.isdir(name) and os.path.isfile(os.path.join(name, "run.json")):  # train.py's, without its ckpt.pt
        saved = sorted(f for f in os.listdir(name) if f.endswith(".pt"))  # best.pt, kept ckpt_<iter>.pt
        raise UserError(f"{name} is a training run's folder with no ckpt.pt, not a transformers model: "
                        + (f"pass --init_from={os.path.join(name, saved[-1])} (it keeps {', '.join(saved)})" if saved
                           else "its run has not saved yet (or stopped before its first save), so there are no weights "
                                "to start from"))
    if os.path.isdir(name) and not os.path.isfile(os.path.join(name, "config.json")):
        raise UserError(f"{name} is a folder without config.json, so not a transformers model: give a folder written "
                        "by export.py or save_pretrained")
    if os.path.isdir(name) and not has_weights(name):
        raise UserError(f"{name} has a config.json but no weights ({', '.join(WEIGHT_FILES[::2])} or their sharded "
                        "index): copy the whole folder that export.py or save_pretrained wrote")
    tf = transformers_module()
    source = name if os.path.isdir(name) else cached_copy(name) or name
    try:
        kind = tf.AutoConfig.from_pretrained(source).model_type
        cls = {"gpt2": tf.GPT2LMHeadModel, "llama": tf.LlamaForCausalLM}.get(kind)
        if cls is None:
            raise UserError(f"{name} holds a transformers {kind!r} model: only GPT-2 and LLaMA models load")
        with no_progress_bars():
            hf_model, info = cls.from_pretrained(source, output_loading_info=True)
    except UserError:
        raise
    except Exception as e:  # a damaged file in the folder (an OSError too, from transformers), or no network
        if source != name:  # the hub's copy: a download cut short, say
            raise UserError(f"could not read the hub's cached copy of {name} in {source} ({e.__class__.__name__}: "
                            f"{str(e)[:200]}): it is damaged; delete {os.path.dirname(os.path.dirname(source))} and "
                            "load it again where there is network") from e
        if isinstance(e, OSError) and not os.path.isdir(name):
            raise UserError(f"could not load '{name}' ({e.__class__.__name__}): without network access, save the "
                            "model on a machine that has it (GPT2LMHeadModel.from_pretrained(name).save_pretrained("
                            "folder)) and pass that folder") from e
        # safetensors', json's and torch's errors share no base
        raise UserError(f"could not read the model in {name} ({e.__class__.__name__}: {str(e)[:200]}): the folder is "
                        "damaged; write it again (export.py, or save_pretrained)") from e
    # transformers fills a weight the files lack with random values and drops one its config has no place for
    missing = sorted(info.get("missing_keys") or ())
    # (GPT-2 folders of older transformers keep the mask buffers, which transformers 5 names as unexpected)
    unexpected = sorted(k for k in info.get("unexpected_keys") or () if not k.endswith(MASK_BUFFERS))
    if missing or unexpected:
        listed = "; ".join(f"{kind} {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''} ({len(keys)} in all)"
                           for kind, keys in (("missing", missing), ("unexpected", unexpected)) if keys)
        raise UserError(f"the weights in {name} do not fit its config.json ({listed}): copy the whole folder that "
                        "export.py or save_pretrained wrote (a base model saved without its language-model head "
                        "does not load)")
    return from_transformers(hf_model, dropout)


def is_gpt2_vocab(ids: dict) -> bool:
    """Whether a token -> id table (a tokenizer.json's, or vocab.json) is GPT-2's."""
    return len(ids) == 50257 and ids.get("<|endoftext|>") == 50256 and ids.get("\u0120the") == 262  # Ġthe: " the"


def vocabulary_without_tokenizer_json(folder: str) -> dict | None:
    """A folder's vocabulary from the files of a tokenizer saved without tokenizer.json: GPT-2's from a vocab.json
    that is GPT-2's; None when there are no tokenizer files (a model saved alone, as GPT-2 is in the offline
    route); another tokenizer's files (sentencepiece's, say) are a UserError."""
    found = [n for n in ("tokenizer.model", "spiece.model", "vocab.json", "merges.txt")
             if os.path.isfile(os.path.join(folder, n))]
    if not found:
        return None
    ids = read_json(os.path.join(folder, "vocab.json"), "write the folder again") or {}
    if isinstance(ids, dict) and is_gpt2_vocab(ids):
        return {"tokenizer": "gpt2", "chars": None}
    raise UserError(f"{folder} holds a tokenizer ({', '.join(found)}) that is neither GPT-2's BPE nor one token per "
                    "character: this project's data, sampling and evaluation encode only those two")


def read_vocabulary(folder: str) -> dict | None:
    """The vocabulary (as checkpoints keep it) of the tokenizer.json in a transformers folder: a character table
    as write_tokenizer writes one, {'tokenizer': 'gpt2'} for GPT-2's BPE, None when the folder has no tokenizer
    files (see vocabulary_without_tokenizer_json). Any other tokenizer is a UserError: the project's data and
    sampling encode only these two."""
    path = os.path.join(folder, "tokenizer.json")
    saved = read_json(path, "write the folder again (export.py)")
    if saved is None:
        return vocabulary_without_tokenizer_json(folder)
    try:
        model = saved["model"]
        ids = {**model["vocab"], **{t["content"]: t["id"] for t in saved.get("added_tokens", [])}}
    except (KeyError, TypeError) as e:
        raise UserError(f"{path} is damaged ({e.__class__.__name__}): write the folder again (export.py)") from None
    # a character vocabulary, and the <|endoftext|> after it that data/prepare.py's char datasets have
    chars = {c: i for c, i in ids.items() if not (c == "<|endoftext|>" and i == len(ids) - 1)}
    in_order = sorted(chars, key=chars.get)
    if model.get("type") == "BPE" and not model.get("merges") and all(len(c) == 1 for c in chars) \
            and [chars[c] for c in in_order] == list(range(len(chars))):
        return {"tokenizer": "char", "chars": "".join(in_order)}
    if is_gpt2_vocab(ids):
        return {"tokenizer": "gpt2", "chars": None}
    raise UserError(f"{path} is a tokenizer of {len(ids):,} tokens that is neither GPT-2's BPE nor one token per "
                    "character: this project's data, sampling and evaluation encode only those two")


# ---- tokenizer files

def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the other 68
    take the code points from 256 up, in byte order (the vocab.json and merges.txt convention)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    symbols, extra = {}, 256
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b], extra = chr(extra), extra + 1
    return [symbols[b] for b in range(256)]


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list that builds each multi-byte token from tiktoken-style ranks: a token of rank r is the
    merge of the two parts that byte-pair encoding with only the merges ranked below r leaves of it."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            i = min(range(len(parts) - 1), key=lambda j: ranks.get(parts[j] + parts[j + 1], rank))
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def write_tokenizer(vocab: dict | None, vocab_size: int, folder: str) -> str:
    """Tokenizer files for a model's vocabulary (as checkpoints keep it; None: GPT-2's BPE) in folder, loadable
    with AutoTokenizer; returns what it wrote, in words. A character model of vocab_size past its characters
    (data/prepare.py's, which ends each document with one) has <|endoftext|> as the id after them, its eos."""
    tf = transformers_module()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # installed with transformers

    chars = (vocab or {}).get("chars")
    if chars is not None:  # one token per character, nothing merged
        # a character the model lacks would be dropped from the text without a word; an unknown token that is not
        # in the vocabulary makes it an error instead, whose message is this name
        unknown = "<a character this model was not trained on>"
        tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[], unk_token=unknown))
        tok.decoder = decoders.Fuse()
        eot = char_eot(chars, vocab_size) is not None
        if eot:
            tok.add_special_tokens(["<|endoftext|>"])  # the next id: len(chars)
        tf.PreTrainedTokenizerFast(tokenizer_object=tok,
                                   eos_token="<|endoftext|>" if eot else None).save_pretrained(folder)
        article = "an" if str(len(chars))[0] == "8" or len(chars) in (11, 18) else "a"  # an 86-, an 11-
        return f"{article} {len(chars)}-character tokenizer" + (" with <|endoftext|>" if eot else "")

    enc = gpt2_encoding()
    ranks = {enc.decode_single_token_bytes(i): i for i in range(EOT)}
    symbols = byte_symbols()
    spell = lambda b: "".join(symbols[x] for x in b)
    tok = Tokenizer(models.BPE(vocab={spell(b): i for b, i in ranks.items()},
                               merges=[(spell(a), spell(b)) for a, b in bpe_merges(ranks)]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's split, then bytes as symbols
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                               unk_token="<|endoftext|>").save_pretrained(folder)
    return "GPT-2's BPE tokenizer"


def special_tokens(vocab: dict | None, vocab_size: int) -> dict:
    """bos/eos ids for a model config: GPT-2's <|endoftext|> when the model has GPT-2's BPE; a character model's
    <|endoftext|> (the id after its characters, see write_tokenizer) as its eos; else none."""
    chars = (vocab or {}).get("chars")
    if chars is None and vocab_size > EOT:
        return {"bos_token_id": EOT, "eos_token_id": EOT}
    return {"bos_token_id": None, "eos_token_id": char_eot(chars, vocab_size) if chars is not None else None}
