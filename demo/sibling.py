"""What every sibling of the demo model (demo-notes, demo-tools) shares: fine-tuning from the given
weights, and the report its card is written from, with the demo's own card figures measured again."""

from __future__ import annotations

import json
import time
from typing import Callable

from demo.card import missed_criteria
from demo.evaluate import evaluate
from demo.train import init_weights, save_and_reload, stress_test, train
from localchat.environment import collect


def fine_tune(args, tok, rows: list, group):
    """Train ``args.demo``'s weights (dequantized) on ``rows``; rank 0 gets the saved, quantized model
    back as mlx_lm loads it, the other ranks None."""
    config = json.loads((args.demo / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        config.pop(key, None)
    model = train(args, tok, [rows], config, group, init_weights(args.demo))
    if group.rank() != 0:
        return None
    return save_and_reload(model, tok, config, args)


def within_a_point(before: dict, after: dict) -> list[str]:
    """The card's figures that moved by more than one point (behaviours and the stress test)."""
    def moved(section: str) -> list[str]:
        return [b for b, s in before[section].items() if round(abs(after[section][b]["rate"] - s["rate"]), 6) > 0.01]

    return moved("behaviours") + moved("stress")


def write_report(args, model, tok, *, kind: str, before: dict, own: dict, started: float, train_s: float,
                 card: Callable[[dict, dict], str]) -> dict:
    """``eval.json`` and ``README.md`` beside the weights: the demo card's figures measured again on
    held-out conversations, the sibling's ``own`` figures, and how it was made."""
    report = {**{k: before[k] for k in ("layers", "hidden", "heads", "parameters", "vocab")},
              f"{kind}_fine_tune": {"seed": args.seed, "steps": args.steps, "batch": args.batch, "lr": args.lr,
                                    "share": args.share, "training_minutes": round(train_s / 60, 2)},
              "hardware": collect().hardware_label,
              **evaluate(model, tok, n=args.eval_n, seed=before["seed"] + 10_000),
              "stress": stress_test(model, tok, n=args.eval_n, seed=before["seed"] + 20_000),
              **own}
    report["card_figures_moved"] = within_a_point(before, report)
    report["missed_criteria"] = missed_criteria(report)
    report["total_minutes"] = round((time.perf_counter() - started) / 60, 2)
    (args.out / "eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False))
    (args.out / "README.md").write_text(card(report, before), encoding="utf-8")
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return report


def card_table_rows(report: dict, card: dict, own: dict[str, dict]) -> list[str]:
    """Rows of a sibling card's table: the demo card's figures before and after, then the sibling's
    ``own`` figures (which the demo never had)."""
    def row(name: str, was: dict | None, now: dict) -> str:
        before = f"{was['passed']}/{was['total']}" if was else "–"
        return f"| {name} | {before} | {now['passed']}/{now['total']} |"

    rows = [row(b, card["behaviours"][b], report["behaviours"][b]) for b in report["behaviours"]]
    rows += [row(f"stress: {b}", card["stress"][b], report["stress"][b]) for b in report["stress"]]
    return rows + [row(b, None, figures) for b, figures in own.items()]
