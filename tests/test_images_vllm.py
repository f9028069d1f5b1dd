"""Images with exact tokens on a real vLLM (0.32 CPU build) serving the tiny random Idefics3
(testbed/turnstile_testbed/vlm.py), through the recording relay: what vLLM received and echoed is
the truth, and so is transformers' processor applied to the same conversation.

Seen on this vLLM (held here): ``/inference/v1/generate`` with one ``<image>`` per image and
``content_parts`` expands each to its 7-ID block and echoes ``prompt_token_ids`` and
``mm_placeholders`` (the whole block); IDs sent already expanded are expanded again (a 200).
"""

from __future__ import annotations

import asyncio
import io
from array import array

import pytest
from PIL import Image as PILImage

from turnstile import media
from turnstile.chat.vision import ImageExpander
from turnstile.engines.base import EngineError, Finish, SamplingParams
from turnstile.engines.vllm import VLLMEngine
from turnstile.testing.relay import start_relay
from turnstile_testbed import vllm as testbed_vllm
from turnstile_testbed import vlm as testbed_vlm

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]


def png(color: tuple[int, int, int], size: tuple[int, int] = (40, 20)) -> media.Image:
    out = io.BytesIO()
    PILImage.new("RGB", size, color).save(out, "PNG")
    return media.decode(out.getvalue())


@pytest.fixture(scope="module")
def model():
    return testbed_vlm.tiny_vlm()


@pytest.fixture(scope="module")
def relay(model, tmp_path_factory):
    log = tmp_path_factory.mktemp("vlm") / "vllm.log"
    extra = ["--enable-scale-out", "--dtype", "float32", "--max-model-len", "1024"]
    extra += ["--limit-mm-per-prompt", '{"image": 8}']
    with testbed_vllm.vllm_server(model, extra=extra, log=log) as url:
        rel, server = start_relay(url)
        try:
            yield rel
        finally:
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def hf(model):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(model))


def processor_ids(hf, messages: list[dict], images: list[media.Image], prompt: bool = True):
    """transformers' own full render: chat template, then the processor's expansion."""
    text = hf.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
    pils = [PILImage.open(io.BytesIO(i.data)).convert("RGB") for i in images]
    out = hf(text=text, images=[pils] if pils else None, return_tensors="np")
    return [int(t) for t in out["input_ids"][0]]


def rendered(hf, messages: list[dict], prompt: bool = True) -> list[int]:
    """The template's IDs with one placeholder per image (what Turnstile's renderer gives)."""
    text = hf.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False)
    return hf.tokenizer(text, add_special_tokens=False)["input_ids"]


def run(engine: VLLMEngine, prompt, max_tokens: int = 4) -> tuple[list[int], Finish]:
    async def go():
        await engine.start()
        ids: list[int] = []
        fin = None
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        async for ev in engine.generate(prompt, params, stream=False):
            if isinstance(ev, Finish):
                fin = ev
            else:
                ids.extend(ev.ids)
        await engine.close()
        assert fin is not None
        return ids, fin

    return asyncio.run(go())


def calls(relay, n: int) -> list:
    """The generate calls since exchange ``n`` (the adapter's start-up probes left out)."""
    return [e for e in relay.exchanges[n:] if e.request.get("token_ids")]


USER = [{"type": "text", "text": "What is this?"}, {"type": "image"}]


def test_one_image_goes_out_collapsed_and_comes_back_as_the_processor_expands_it(relay, hf, model):
    image = png((200, 10, 10))
    messages = [{"role": "user", "content": USER}]
    expander = ImageExpander(model)
    prompt = expander.expand(rendered(hf, messages), [image])
    assert prompt.ids.tolist() == processor_ids(hf, messages, [image])
    n = len(relay.exchanges)
    out, fin = run(VLLMEngine(relay.url, api="generate"), prompt)
    (ex,) = calls(relay, n)
    assert ex.path == "/inference/v1/generate"
    # sent: one placeholder, the image by data URL, its uuid the sha256 of its bytes
    assert ex.request["token_ids"].count(expander.placeholder_id) == 1
    assert ex.request["token_ids"] == prompt.collapsed().tolist()
    (part,) = ex.request["content_parts"]
    assert part["uuid"] == image.sha256 and part["url"].startswith("data:image/png;base64,")
    # vLLM's echo is the recorded expansion, the block where the record says
    assert ex.response["prompt_token_ids"] == prompt.ids.tolist()
    (m,) = prompt.media
    assert ex.response["mm_placeholders"] == {"image": [{"offset": m.offset, "length": m.length}]}
    assert ex.response["choices"][0]["token_ids"] == out and len(out) == 4
    assert m.processor["name"] == "Idefics3Processor" and m.grid == (1, 3, 32, 32)


def test_a_second_turn_extends_the_first_without_expanding_its_image_twice(relay, hf, model):
    red, blue = png((200, 10, 10)), png((10, 10, 200), (16, 48))
    expander = ImageExpander(model)
    first = [{"role": "user", "content": USER}]
    p1 = expander.expand(rendered(hf, first), [red])
    out, _ = run(VLLMEngine(relay.url, api="generate"), p1)
    # the next call: the recorded prompt + completion, then the new messages' render
    prefix = media.MediaPrompt(array("i", [*p1.ids, *out]), p1.media, p1.images, p1.placeholder)
    new = [{"role": "user", "content": [{"type": "text", "text": "And this?"}, {"type": "image"}]}]
    delta = expander.expand(rendered(hf, new), [blue])
    p2 = media.join(prefix, delta)
    assert isinstance(p2, media.MediaPrompt) and p2.ids[: len(p1.ids)] == p1.ids
    n = len(relay.exchanges)
    run(VLLMEngine(relay.url, api="generate"), p2)
    (ex,) = calls(relay, n)
    assert ex.request["token_ids"].count(expander.placeholder_id) == 2  # one per image
    assert ex.response["prompt_token_ids"] == p2.ids.tolist()
    blocks = ex.response["mm_placeholders"]["image"]
    assert [b["offset"] for b in blocks] == [m.offset for m in p2.media]
    assert p2.ids.count(expander.placeholder_id) == 8  # 4 image tokens each, no more


def test_an_expansion_vllm_does_not_echo_is_an_error(relay, hf, model):
    image = png((0, 200, 0))
    prompt = ImageExpander(model).expand(rendered(hf, [{"role": "user", "content": USER}]), [image])
    (m,) = prompt.media
    # the record would claim one image token less than the processor writes
    ids = array("i", prompt.ids)
    del ids[m.offset + 2]
    short = media.MediaPrompt(
        ids,
        (media.MediaItem(m.sha256, m.mime, m.offset, m.length - 1),),
        prompt.images,
        prompt.placeholder,
    )
    with pytest.raises(EngineError, match="expanded the images to 20 prompt IDs"):
        run(VLLMEngine(relay.url, api="generate"), short)


# Through Turnstile: the official openai client, a two-turn session with an image per turn.


@pytest.fixture(scope="module")
def ts(relay, model, tmp_path_factory):
    from conftest import Turnstile

    tmp = tmp_path_factory.mktemp("ts")
    args = ("--engine", "vllm", "--vllm-api", "generate")
    t = Turnstile(relay.url, model, tmp / "data", tmp / "turnstile.log", args).start()
    yield t
    t.stop()


def data_url(image: media.Image) -> str:
    import base64

    return f"data:{image.mime};base64," + base64.b64encode(image.data).decode()


def test_openai_client_two_turns_with_images_record_vllms_expansion(relay, hf, ts):
    import openai

    red, blue = png((200, 10, 10)), png((10, 10, 200), (16, 48))
    session = ts.client().session({"test": "images"})
    client = openai.OpenAI(base_url=session.base_url, api_key="x", max_retries=0, timeout=180)
    eos = 2  # <|im_end|>: forced, so each reply ends its turn whatever the weights sample
    turn1 = [
        {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": data_url(red)}},
        ]},
    ]  # fmt: skip
    n = len(relay.exchanges)
    r1 = client.chat.completions.create(
        model="m", messages=turn1, max_tokens=4, temperature=0, logit_bias={str(eos): 100}
    )
    turn2 = [
        *turn1,
        {"role": "assistant", "content": r1.choices[0].message.content or ""},
        {"role": "user", "content": [
            {"type": "text", "text": "And this?"},
            {"type": "image_url", "image_url": {"url": data_url(blue)}},
        ]},
    ]  # fmt: skip
    client.chat.completions.create(model="m", messages=turn2, max_tokens=4, temperature=0)
    ex1, ex2 = calls(relay, n)
    c1, c2 = session.calls()
    p1 = c1["prompt_delta_ids"]
    ctx1 = p1 + c1["completion_ids"]
    assert c2["reused_prefix_len"] == len(ctx1) > 0  # the second turn extends the first
    p2 = ctx1 + c2["prompt_delta_ids"]
    # each recorded prompt is vLLM's own expansion, and transformers' full render
    assert ex1.response["prompt_token_ids"] == p1 == processor_ids(hf, as_hf(turn1), [red])
    assert ex2.response["prompt_token_ids"] == p2 == processor_ids(hf, as_hf(turn2), [red, blue])
    # sent collapsed: one placeholder per image, each image's uuid its sha256
    image_id = hf.tokenizer.convert_tokens_to_ids("<image>")
    assert ex2.request["token_ids"].count(image_id) == 2 and p2.count(image_id) == 8
    assert [p["uuid"] for p in ex2.request["content_parts"]] == [red.sha256, blue.sha256]
    # the record's items: spans of the expanded prompt, as vLLM placed them
    spans = [{"offset": m["offset"], "length": m["length"]} for m in c2["media"]]
    assert spans == ex2.response["mm_placeholders"]["image"]
    assert [m["sha256"] for m in c2["media"]] == [red.sha256, blue.sha256]
    # the trainer's side: the sample's images at their spans, the bytes by hash
    (t,) = session.trajectories()
    assert t.token_ids.tolist() == p2 + c2["completion_ids"]
    assert [{"offset": i["offset"], "length": i["length"]} for i in t.images] == spans
    assert all(
        t.token_ids[i["offset"] + 2 : i["offset"] + 6].tolist() == [image_id] * 4 for i in t.images
    )
    assert [session.image(i["sha256"]) for i in t.images] == [red.data, blue.data]
    with pytest.raises(Exception, match="404|no image"):
        session.image("0" * 64)
    # transformers' forward (same weights, the sample's IDs and pixels) gives the logprobs
    got = forward_logprobs(hf_dir(relay), t.token_ids.tolist(), [red.data, blue.data])
    at = t.loss_mask.nonzero()[0]
    diff = max(abs(got[i - 1] - float(t.logprobs[i])) for i in at)
    print(f"[images] max |logprob diff| vLLM vs transformers over {len(at)} tokens: {diff:.2e}")
    assert diff < 1e-3


def as_hf(messages: list[dict]) -> list[dict]:
    """The Chat messages as transformers' processors take them (an ``image`` part)."""
    out = []
    for m in messages:
        c = m["content"]
        if isinstance(c, list):
            c = [{"type": "image"} if p["type"] == "image_url" else p for p in c]
        out.append({**m, "content": c})
    return out


_FORWARD = """
import io, json, sys, torch
from PIL import Image
from transformers import AutoProcessor, Idefics3ForConditionalGeneration
d = json.loads(sys.stdin.read())
proc = AutoProcessor.from_pretrained(d["model"])
model = Idefics3ForConditionalGeneration.from_pretrained(d["model"], dtype=torch.float32).eval()
imgs = [Image.open(io.BytesIO(bytes.fromhex(h))).convert("RGB") for h in d["images"]]
px = proc.image_processor(images=[imgs], return_tensors="pt")
ids = torch.tensor([d["ids"]])
with torch.no_grad():
    out = model(input_ids=ids, pixel_values=px["pixel_values"],
                pixel_attention_mask=px.get("pixel_attention_mask"))
lp = torch.log_softmax(out.logits[0].double(), -1)
nxt = ids[0, 1:]
print(json.dumps(lp[:-1].gather(1, nxt[:, None])[:, 0].tolist()))
"""


def forward_logprobs(model, ids: list[int], images: list[bytes]) -> list[float]:
    """log p(ids[i+1] | ids[:i+1]) from transformers' Idefics3 (the vLLM venv's torch)."""
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    payload = json.dumps({"model": str(model), "ids": ids, "images": [b.hex() for b in images]})
    done = subprocess.run(
        [str(testbed_vllm.vllm_python()), "-c", _FORWARD],
        input=payload, capture_output=True, text=True, env=env, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def hf_dir(_relay):
    return testbed_vlm.tiny_vlm()


def test_after_a_restart_the_prefix_keeps_its_images(relay, hf, ts):
    import openai

    green = png((0, 150, 0), (30, 30))
    session = ts.client().session({"test": "images-restart"})
    eos = {str(2): 100}
    turn1 = [{"role": "user", "content": [
        {"type": "text", "text": "Look."},
        {"type": "image_url", "image_url": {"url": data_url(green)}},
    ]}]  # fmt: skip
    client = openai.OpenAI(base_url=session.base_url, api_key="x", max_retries=0, timeout=180)
    r1 = client.chat.completions.create(
        model="m", messages=turn1, max_tokens=4, temperature=0, logit_bias=eos
    )
    ts.stop()
    ts.start()  # the tree is rebuilt from the store: spans from calls.media, bytes from blobs
    session = ts.client().get_session(session.id)
    client = openai.OpenAI(base_url=session.base_url, api_key="x", max_retries=0, timeout=180)
    turn2 = [
        *turn1,
        {"role": "assistant", "content": r1.choices[0].message.content or ""},
        {"role": "user", "content": "Again?"},
    ]
    n = len(relay.exchanges)
    client.chat.completions.create(
        model="m", messages=turn2, max_tokens=4, temperature=0, logit_bias=eos
    )
    (ex,) = calls(relay, n)
    c1, c2 = session.calls()
    ctx1 = c1["prompt_delta_ids"] + c1["completion_ids"]
    assert c2["reused_prefix_len"] == len(ctx1)
    assert [p["uuid"] for p in ex.request["content_parts"]] == [green.sha256]
    assert ex.response["prompt_token_ids"] == ctx1 + c2["prompt_delta_ids"]
    assert ex.response["prompt_token_ids"] == processor_ids(hf, as_hf(turn2), [green])
    assert [m["sha256"] for m in c2["media"]] == [green.sha256]


def test_anthropic_client_image_in_a_tool_result(relay, hf, ts):
    import base64

    import anthropic

    shot = png((120, 60, 200), (48, 24))
    session = ts.client().session({"test": "images-anthropic"})
    cap = session.base_url.split("/s/")[1].split("/")[0]
    client = anthropic.Anthropic(base_url=ts.url, api_key=cap, max_retries=0, timeout=180)
    src = {
        "type": "base64",
        "media_type": "image/png",
        "data": base64.b64encode(shot.data).decode(),
    }
    messages = [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "Here it is."}, {"type": "image", "source": src},
            ]},
        ]},
    ]  # fmt: skip
    n = len(relay.exchanges)
    client.messages.create(model="m", max_tokens=3, messages=messages)
    (ex,) = calls(relay, n)
    (c,) = session.calls()
    # the tool message holds the image where the screenshot tool returned it
    hf_messages = [
        {"role": "user", "content": "Take a screenshot."},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": [{"type": "text", "text": "Here it is."}, {"type": "image"}]},
    ]
    assert ex.response["prompt_token_ids"] == c["prompt_delta_ids"]
    assert c["prompt_delta_ids"] == processor_ids(hf, hf_messages, [shot])
    assert [p["uuid"] for p in ex.request["content_parts"]] == [shot.sha256]
    assert session.image(shot.sha256) == shot.data


def test_openai_responses_input_image_and_a_function_output_image(relay, hf, ts):
    """The openai client's Responses API: an ``input_image`` in the user turn, then (chained
    by ``previous_response_id``) a screenshot in a ``function_call_output``: each recorded
    prompt is vLLM's echo and transformers' processor render; the second extends the first."""
    import openai

    red, shot = png((220, 30, 30)), png((30, 160, 90), (24, 40))
    session = ts.client().session({"test": "images-responses"})
    client = openai.OpenAI(base_url=session.base_url, api_key="x", max_retries=0, timeout=180)
    eos = 2
    n = len(relay.exchanges)
    first = [
        {"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": data_url(red), "detail": "auto"},
        ]},
    ]  # fmt: skip
    r1 = client.responses.create(
        model="m",
        input=first,  # type: ignore[arg-type]
        max_output_tokens=3,
        temperature=0,
        extra_body={"logit_bias": {str(eos): 100}},
    )
    client.responses.create(
        model="m",
        previous_response_id=r1.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": "call_9",
                "output": [
                    {"type": "input_text", "text": "Screen:"},
                    {"type": "input_image", "image_url": data_url(shot)},
                ],
            },
        ],  # type: ignore[arg-type]
        max_output_tokens=3,
        temperature=0,
    )
    ex1, ex2 = calls(relay, n)
    c1, c2 = session.calls()
    turn1 = [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image"}]}
    ]
    assert ex1.response["prompt_token_ids"] == c1["prompt_delta_ids"]
    assert c1["prompt_delta_ids"] == processor_ids(hf, turn1, [red])
    p2 = c1["prompt_delta_ids"] + c1["completion_ids"] + c2["prompt_delta_ids"]
    assert c2["reused_prefix_len"] == len(c1["prompt_delta_ids"]) + len(c1["completion_ids"])
    assert ex2.response["prompt_token_ids"] == p2
    turn2 = [
        *turn1,
        {"role": "assistant", "content": r1.output_text},
        {"role": "tool", "content": [{"type": "text", "text": "Screen:"}, {"type": "image"}]},
    ]
    assert p2 == processor_ids(hf, turn2, [red, shot])
    assert [p["uuid"] for p in ex2.request["content_parts"]] == [red.sha256, shot.sha256]
    assert session.image(shot.sha256) == shot.data
