"""MaLP personalization on CPU: LoRA on SmolLM2-135M-Instruct with the DPeM memory as prefix.

Two scripted patients (``benchmarks/dpem_data.py``): ann (diabetes, concise answers) and bob
(asthma, long explanations). ann's DPeM memory is built from her sessions (rule-based
coordinator ``dpem_reply``, hashing embedder), then her adapter is trained on her assistant
turns with the recalled memory as prompt prefix (eq. 3). Measured:

* seconds per training step, steps to converge (first step after which the 5-step moving
  average of the loss stays within 10% of its final value), adapter size on disk, peak RSS;
* held-out perplexity of ann's *unseen* exchanges (4 question/answer pairs never said in
  her sessions, so neither trained on nor in her memory; same doctor's style) before and
  after her adapter, and of bob's 2 unseen exchanges (another user, his own memory as
  prefix) scored with ann's adapter.

    python benchmarks/personalize_bench.py [--steps 40] [--lr 5e-5 3e-4] [--sessions 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpem_data import held_out_pairs, patient_rounds

from memories_core import DualProcessMemory, Scope
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.personalize import LoRAConfig, Personalizer, TrainingExample
from memories_core.prompts.dpem import dpem_reply

OUT = Path(__file__).resolve().parent / "out"
HELD_OUT = 4
BOB_HELD_OUT = 2


def converged_at(losses: list[float], window: int = 5, tolerance: float = 0.10) -> int:
    """First step after which the moving average stays within ``tolerance`` of the final one."""
    if len(losses) < window:
        return len(losses)
    avg = [sum(losses[i - window + 1 : i + 1]) / window for i in range(window - 1, len(losses))]
    final = avg[-1]
    step = len(losses)
    for i in range(len(avg) - 1, -1, -1):
        if abs(avg[i] - final) > tolerance * abs(final):
            break
        step = i + window
    return step


def held_out(
    personalizer: Personalizer, user: str, pairs: list[tuple[str, str]]
) -> list[TrainingExample]:
    return [TrainingExample(tuple(personalizer.prompt_messages(user, [], q)), a) for q, a in pairs]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, nargs="+", default=[3e-4, 5e-5])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--max-input-tokens", type=int, default=384)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on a busy CPU)"
    )
    parser.add_argument("--json", type=Path, default=OUT / "personalize_bench.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results: dict[str, object] = {"steps": args.steps, "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        memory = DualProcessMemory(
            path=Path(tmp) / "m",
            llm=ScriptedLLM(default=dpem_reply),
            embedder=HashingEmbedder(dimension=256),
            theta=2,
        )
        for user in ("ann", "bob"):
            for turns in patient_rounds(
                user, args.sessions, held_out=HELD_OUT if user == "ann" else BOB_HELD_OUT
            ):
                memory.save(turns, Scope(user))
        runs = []
        for lr in args.lr:
            config = LoRAConfig(
                learning_rate=lr, max_steps=args.steps, max_input_tokens=args.max_input_tokens
            )
            personalizer = Personalizer(memory, config=config)
            train_examples = personalizer.examples("ann")
            own = held_out(personalizer, "ann", held_out_pairs("ann", HELD_OUT))
            other = held_out(personalizer, "bob", held_out_pairs("bob", BOB_HELD_OUT))
            t0 = time.perf_counter()
            base_own = personalizer.perplexity(own)
            base_other = personalizer.perplexity(other)
            eval_seconds = (time.perf_counter() - t0) / (len(own) + len(other))
            report = personalizer.train("ann", progress=True)
            after_own = personalizer.perplexity(own, adapter_of="ann")
            after_other = personalizer.perplexity(other, adapter_of="ann")
            reply_base = personalizer.generate(
                None,
                personalizer.prompt_messages("ann", [], "I got red spots on my skin recently"),
                max_new_tokens=40,
            ).text
            reply_lora = personalizer.generate(
                "ann",
                personalizer.prompt_messages("ann", [], "I got red spots on my skin recently"),
                max_new_tokens=40,
            ).text
            run = {
                "lr": lr,
                "train_examples": len(train_examples),
                "seconds_per_step": round(report.seconds_per_step, 3),
                "train_seconds": round(report.seconds, 1),
                "converged_at": converged_at(list(report.losses)),
                "first_loss": round(report.losses[0], 3),
                "final_loss_avg5": round(sum(report.losses[-5:]) / 5, 3),
                "adapter_bytes": report.adapter_bytes,
                "trainable_parameters": report.trainable_parameters,
                "ppl_own_before": round(base_own, 2),
                "ppl_own_after": round(after_own, 2),
                "ppl_other_before": round(base_other, 2),
                "ppl_other_after": round(after_other, 2),
                "eval_seconds_per_example": round(eval_seconds, 3),
                "peak_rss_mb": round(peak_rss_mb()),
                "reply_base": reply_base,
                "reply_lora": reply_lora,
                "losses": [round(x, 4) for x in report.losses],
            }
            print(json.dumps({k: v for k, v in run.items() if k != "losses"}, indent=1))
            runs.append(run)
            personalizer.delete_adapter("ann")
        memory.close()
    results["runs"] = runs
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    lines = [
        "| lr | s/step | converged at | loss first -> last5 | adapter | peak RSS | "
        "ppl ann held-out before -> after | ppl bob before -> after (ann's adapter) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['lr']:g} | {r['seconds_per_step']} | {r['converged_at']}/{args.steps} | "
            f"{r['first_loss']} -> {r['final_loss_avg5']} | {r['adapter_bytes'] / 1e6:.2f} MB | "
            f"{r['peak_rss_mb']} MB | {r['ppl_own_before']} -> {r['ppl_own_after']} | "
            f"{r['ppl_other_before']} -> {r['ppl_other_after']} |"
        )
    table = "\n".join(lines)
    print(table)
    args.json.with_suffix(".md").write_text(table + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for r in runs:
            ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=f"lr {r['lr']:g}")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (assistant tokens)")
        ax.set_title("MaLP LoRA on SmolLM2-135M, one user, CPU")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.json.with_suffix(".png"), dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
