"""What the commands have in common: read the prompts, load the engine, run it, check against transformers.

The order matters for the user: everything that can be checked without a model (the prompts file, option
combinations, output paths) is checked first, so a typo fails in milliseconds rather than after a load.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from core import LLM, SamplingParams
from core.errors import InvalidParamsError
from core.prompts import Prompt, PromptSpec, chat_input_ids, read_prompts
from core.reference import HFReference, Verdict, compare
from minisgl_cli.options import EngineOptions, SamplingOptions
from render.progress import GenerationProgress

Result = dict[str, Any]


@dataclass(frozen=True)
class Job:
    """The prompts of one command with the sampling parameters each will run with."""

    specs: list[PromptSpec]
    params: list[SamplingParams]

    @property
    def labels(self) -> list[str]:
        """How each prompt is shown: its text, or its token ids."""
        return [p.prompt if isinstance(p.prompt, str) else str(p.prompt) for p in self.specs]


def load_job(source: Path | str, sampling: SamplingOptions) -> Job:
    specs = read_prompts(source, stdin=sys.stdin)
    explicit = sampling.explicit()
    try:
        SamplingParams(**explicit)  # a bad option is the command line's fault, not the file's
    except InvalidParamsError as exc:
        raise InvalidParamsError(f"bad sampling option: {exc}") from None
    # every field is validated on its own, so file values (checked when read) and options combine safely
    return Job(specs, [spec.params(explicit) for spec in specs])


def require_greedy(job: Job) -> None:
    """Verification compares greedy decoding; sampled outputs have no single right answer."""
    for spec, params in zip(job.specs, job.params):
        if not params.greedy:
            raise InvalidParamsError(f"verify compares greedy decoding, but the prompt on {spec.where} would be "
                                     f"sampled (temperature={params.temperature}); set --temperature 0")


def quiet_transformers() -> None:
    """transformers' own progress bars and notices would interleave with ours; its errors still show."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_llm(opts: EngineOptions, err: Console) -> LLM:
    """Build the engine under a status line; the slow first conversion of a GGUF says so as it starts."""
    quiet_transformers()
    name = opts.model or "the embedded SmolLM2-135M-Instruct"
    with err.status(f"loading {escape(name)}") as status:
        def log(message: str) -> None:
            err.print(f"[dim]{escape(message)}[/]", soft_wrap=True)
            status.update(escape(message))

        return LLM(opts.model, cache=opts.cache, page_size=opts.page_size, max_running_req=opts.max_running,
                   num_pages=opts.num_pages, attention=opts.attention, cuda_graph_max_bs=opts.cuda_graph_max_bs,
                   tp=opts.tp, dtype=opts.dtype, kv_dtype=opts.kv_dtype, log=log)


def engine_inputs(llm: LLM, job: Job, chat: bool) -> list[Prompt]:
    """What goes to ``generate``: text as is, or the chat template's token ids; token-id prompts pass through."""
    if not chat:
        return [spec.prompt for spec in job.specs]
    return [chat_input_ids(llm.tokenizer, s.prompt) if isinstance(s.prompt, str) else s.prompt for s in job.specs]


def generate_with_progress(llm: LLM, inputs: list[Prompt], job: Job, err: Console) -> list[Result]:
    with GenerationProgress(err, total=len(inputs)) as progress:
        llm.add_reply_callback(progress.on_reply)
        return llm.generate(inputs, job.params)


def check_against_reference(llm: LLM, inputs: list[Prompt], job: Job, results: list[Result],
                            err: Console) -> list[Verdict]:
    """transformers greedy, one prompt at a time, compared with each engine result (errors are not re-run)."""
    with err.status("loading the transformers reference"):
        reference = HFReference(llm.model_dir)
    verdicts = []
    with err.status("") as status:
        for i, (prompt, params, result) in enumerate(zip(inputs, job.params, results)):
            status.update(f"transformers greedy reference: prompt {i + 1}/{len(inputs)}")
            if result["finish_reason"] == "error":
                verdicts.append(Verdict("error", error=result["error"]))
                continue
            ref = reference.greedy(llm.tokenize(prompt), params.max_tokens, llm.eos_token_ids, params.ignore_eos)
            verdicts.append(compare(result["token_ids"], result["finish_reason"], ref, llm.eos_token_ids))
    return verdicts
