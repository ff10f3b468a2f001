"""Prompt embeddings for the video models, cached per prompt.

They come from the checkpoint's own text encoder or from a file.
A :class:`PromptBook` turns a prompt into what the transformer's cross-attention reads.
That is ``embeds float32 [L, D]`` and ``mask float32 [L]``, where 1 marks a real token.
There are always ``L = max_tokens`` rows, zero-padded, so a stage's port has one shape.

- text, with the folder's ``text_encoder/`` + ``tokenizer/``, run by transformers. Wan 2.1 uses UMT5-XXL; SANA-Video
  uses Gemma 2. The text is tokenised to ``max_tokens`` and encoded. The rows after the prompt's tokens are set to
  zero, as diffusers' ``WanPipeline`` does. The prompt is encoded as given. Diffusers' ``SanaVideoPipeline`` by
  default prefixes a long "complex human instruction"; that is not done here.
- a ``.safetensors`` file holding ``prompt_embeds [L, D]`` or ``[1, L, D]``, and optionally ``prompt_attention_mask
  [L]``. It serves folders without a text encoder, or skips loading one.

Each distinct prompt is encoded once.
``cache`` holds at most ``cache_size`` entries; the oldest is dropped.
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict

import torch
from safetensors.torch import load_file

__all__ = ["PromptBook", "load_prompt_embeds"]


def load_prompt_embeds(path: str, text_dim: int, max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Read ``prompt_embeds`` and optional ``prompt_attention_mask`` from a safetensors file.

    ``prompt_embeds`` is ``[L, D]`` or ``[1, L, D]``.
    Returns ``(embeds float32 [L', D], mask float32 [L'])`` with ``L' = max_tokens or L``.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"prompt embeddings {path}: no such file; expected a .safetensors file with a "
                                f"'prompt_embeds' tensor [L, {text_dim}]")
    try:
        tensors = load_file(path)
    except Exception as exc:  # safetensors raises its own error types for a file that is not one
        raise ValueError(f"prompt embeddings {path}: not a readable safetensors file ({exc})") from None
    embeds = tensors.get("prompt_embeds")
    if embeds is not None and embeds.dim() == 3 and embeds.shape[0] == 1:
        embeds = embeds[0]
    if embeds is None or embeds.dim() != 2 or embeds.shape[1] != text_dim:
        found = {k: list(v.shape) for k, v in tensors.items()}
        raise ValueError(
            f"prompt embeddings {path}: holds {found}; expected 'prompt_embeds' of shape [L, {text_dim}] (the "
            f"model's text width) and optionally 'prompt_attention_mask' [L]"
        )
    mask = tensors.get("prompt_attention_mask")
    mask = torch.ones(embeds.shape[0]) if mask is None else mask.reshape(-1).float()
    if mask.numel() != embeds.shape[0]:
        raise ValueError(f"prompt embeddings {path}: prompt_attention_mask has {mask.numel()} entries for "
                         f"{embeds.shape[0]} embedding rows; expected one per row")
    return _fit(embeds.float(), mask, max_tokens or embeds.shape[0])


def _fit(embeds: torch.Tensor, mask: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut or zero-pad ``[L, D]`` / ``[L]`` to ``rows``; padded rows are zero with mask 0."""
    out = embeds.new_zeros(rows, embeds.shape[1])
    out_mask = mask.new_zeros(rows)
    n = min(rows, embeds.shape[0])
    out[:n], out_mask[:n] = embeds[:n] * mask[:n, None], mask[:n]
    return out, out_mask


class PromptBook:
    """Prompts → ``(embeds [L, D], mask [L])`` on ``device``; see the module docs.

    Args:
        text_dim: ``D``, the model's text width. It is checked against the encoder and files.
        max_tokens: ``L``. Wan 2.1 was trained with 512, SANA-Video with 300.
        folder: a diffusers folder with ``text_encoder/`` and ``tokenizer/``. None: files only.
        device / dtype: where the text encoder runs and the embeddings are returned, and their precision.
        encoder_dtype: the text encoder's precision. Use bf16 on a GPU: Wan's UMT5-XXL has 5.7 B parameters.
    """

    def __init__(self, text_dim: int, max_tokens: int, *, folder: str | None = None, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, encoder_dtype: torch.dtype = torch.float32,
                 cache_size: int = 32) -> None:
        self.text_dim, self.max_tokens = text_dim, max_tokens
        self.encoder_dtype = encoder_dtype
        self.folder, self.device, self.dtype = folder, device, dtype
        self.cache: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.cache_size = cache_size
        self.encoded = 0  # prompts actually run through the text encoder (not from the cache)
        self._encoder = self._tokenizer = None

    @property
    def has_encoder(self) -> bool:
        return self.folder is not None and os.path.isdir(os.path.join(self.folder, "text_encoder"))

    def file(self, path: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings precomputed in a safetensors file, cached by path; see :func:`load_prompt_embeds`."""
        key = f"file:{os.path.abspath(path)}"
        if key not in self.cache:
            embeds, mask = load_prompt_embeds(path, self.text_dim, self.max_tokens)
            self._keep(key, embeds, mask)
        return self._get(key)

    def text(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings of ``prompt`` from the folder's text encoder, encoded once and then cached."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt {prompt!r}: expected a string")
        key = f"text:{prompt}"
        if key not in self.cache:
            self._keep(key, *self._encode(prompt))
            self.encoded += 1
        return self._get(key)

    def _get(self, key):
        self.cache.move_to_end(key)
        embeds, mask = self.cache[key]
        return embeds.to(self.device, self.dtype), mask.to(self.device)

    def _keep(self, key, embeds, mask) -> None:
        self.cache[key] = (embeds, mask)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)

    def _load_encoder(self) -> None:
        if not self.has_encoder:
            where = self.folder or "the model"
            raise ValueError(
                f"{where} has no text_encoder/ folder, so a text prompt cannot be encoded; pass precomputed "
                f"embeddings (--prompt-embeds FILE.safetensors) or a --base folder that has "
                f"text_encoder/ and tokenizer/"
            )
        import transformers  # only folders with a text encoder need it

        enc_dir, tok_dir = os.path.join(self.folder, "text_encoder"), os.path.join(self.folder, "tokenizer")
        if not os.path.isdir(tok_dir):
            raise ValueError(f"{self.folder}: has text_encoder/ but no tokenizer/; copy the tokenizer/ folder of the "
                             f"same checkpoint next to it")
        index_path = os.path.join(self.folder, "model_index.json")
        class_name = None
        if os.path.isfile(index_path):
            with open(index_path) as f:
                class_name = (json.load(f).get("text_encoder") or [None, None])[1]
        cls = getattr(transformers, class_name, None) if class_name else None
        cls = cls or transformers.AutoModel
        try:
            self._tokenizer = transformers.AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
            self._encoder = cls.from_pretrained(enc_dir, local_files_only=True, dtype=self.encoder_dtype)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.folder}: text_encoder/ or tokenizer/ cannot be loaded ({exc}); copy both folders "
                             f"whole from the checkpoint, or pass --prompt-embeds") from None
        self._encoder = self._encoder.to(self.device).eval()
        width = getattr(self._encoder.config, "d_model", None) or getattr(self._encoder.config, "hidden_size", None)
        if width != self.text_dim:
            raise ValueError(
                f"{enc_dir}: the text encoder's width is {width} but the transformer reads {self.text_dim}-wide "
                f"prompt embeddings; the text_encoder/ does not belong to this transformer"
            )

    @torch.no_grad()
    def _encode(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self._encoder is None:
            self._load_encoder()
        tokens = self._tokenizer([prompt], padding="max_length", max_length=self.max_tokens, truncation=True,
                                 add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        ids, mask = tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
        hidden = self._encoder(input_ids=ids, attention_mask=mask).last_hidden_state[0].float().cpu()
        return _fit(hidden, mask[0].float().cpu(), self.max_tokens)
