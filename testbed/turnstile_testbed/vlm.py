"""The vision part of the test bed: a tiny random Idefics3 (SmolVLM's architecture) built
locally with transformers, for images with exact tokens (issue 43).

No package on the registries ships vision weights, and on the vLLM CPU build the
CLIP/SigLIP-tower families other than Idefics3 do not load (their modules import
torchvision). The shape (:data:`VLM_SHAPE`): 32 px images cut into 8 px patches, a 2x
pixel shuffle, so 4 ``<image>`` tokens per image and one image block
``<fake_token_around_image><global-img><image>x4<fake_token_around_image>``; SmolLM2's
tokenizer with Idefics3's four tokens added; a ChatML template that renders one ``<image>``
per image part (the processor expands it). float32, the LM head scaled up so greedy
decoding has clear margins (the same argmax on any kernel).
"""

from __future__ import annotations

import json
from pathlib import Path

VLM_SHAPE = {
    "text": {
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "intermediate_size": 256,
        "max_position_embeddings": 4096,
    },
    "vision": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    },
    "scale_factor": 2,
    "image_seq_len": 4,
}
VLM_SEED = 0
IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
_VERSION = "v1"  # bump when the build below changes: a new directory, never a stale one

# ChatML, as SmolLM2's, with one <image> per image part (Chat's image_url, an "image" part
# as transformers' processors pass them); text parts as they are.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('image', 'image_url') -%}{{- '<image>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_BUILD = """
import json, sys, shutil, torch
from pathlib import Path
from transformers import (AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration,
                          Idefics3ImageProcessor, Idefics3Processor, LlamaConfig)
shape, seed = json.loads(sys.argv[1]), int(sys.argv[2])
tok_dir, out, template = Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5]
added = json.loads(sys.argv[6])
tok = AutoTokenizer.from_pretrained(str(tok_dir))
tok.add_special_tokens({"additional_special_tokens": added})
tok.chat_template = template
base = json.loads((tok_dir / "config.json").read_text())
vocab = ((len(tok) + 63) // 64) * 64
text = LlamaConfig(vocab_size=vocab, bos_token_id=base["bos_token_id"],
                   eos_token_id=base["eos_token_id"], pad_token_id=base["pad_token_id"],
                   rms_norm_eps=1e-5, tie_word_embeddings=False, dtype="float32",
                   **shape["text"])
config = Idefics3Config(text_config=text.to_dict(), vision_config=shape["vision"],
                        scale_factor=shape["scale_factor"],
                        image_token_id=tok.convert_tokens_to_ids("<image>"),
                        pad_token_id=base["pad_token_id"], tie_word_embeddings=False)
config.architectures = ["Idefics3ForConditionalGeneration"]
config.dtype = "float32"
torch.manual_seed(seed)
model = Idefics3ForConditionalGeneration(config).to(torch.float32).eval()
with torch.no_grad():
    model.lm_head.weight.mul_(50.0)  # logits ~ N(0, 10): greedy margins of whole units
side = shape["vision"]["image_size"]
images = Idefics3ImageProcessor(size={"longest_edge": side}, max_image_size={"longest_edge": side},
                                do_image_splitting=False)
proc = Idefics3Processor(image_processor=images, tokenizer=tok,
                         image_seq_len=shape["image_seq_len"], chat_template=template)
model.save_pretrained(str(out), safe_serialization=True)
proc.save_pretrained(str(out))
tok.save_pretrained(str(out))
gen = {"bos_token_id": base["bos_token_id"], "eos_token_id": base["eos_token_id"],
       "pad_token_id": base["pad_token_id"]}
(out / "generation_config.json").write_text(json.dumps(gen, indent=2))
print("built", out, "vocab", vocab, "image", config.image_token_id)
"""


def tiny_vlm() -> Path:
    """A Hugging Face directory (safetensors, config, processor, tokenizer, chat template)
    holding a random Idefics3 of :data:`VLM_SHAPE`, built once in the vLLM venv; seconds."""
    from .vllm import model_built_in_vllm_venv

    return model_built_in_vllm_venv(
        "tiny-idefics3",
        json.dumps([VLM_SHAPE, VLM_SEED, IMAGE_TOKENS, CHAT_TEMPLATE, _VERSION], sort_keys=True),
        _BUILD,
        lambda tok_dir, out: [
            json.dumps(VLM_SHAPE),
            str(VLM_SEED),
            str(tok_dir),
            str(out),
            CHAT_TEMPLATE,
            json.dumps(list(IMAGE_TOKENS)),
        ],
    )
