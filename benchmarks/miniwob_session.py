"""What a MiniWoB++ episode costs in headless Chromium: browser start, reset on an open page,
one click, one type (click + Ctrl+A + typing), observe, close; plus the success rate of simple
scripted policies on every env of the ``basic`` preset over ``--instances`` seeds each (a check
that the preset is solvable through the click/type session API).

Prints the figures and appends one JSON row to ``benchmarks/results/miniwob_session.jsonl``.
Usage: ``.venv/bin/python benchmarks/miniwob_session.py [--instances 5]``; ``--smoke``: the
``enter-text`` env only (it also times click and type), one instance, the other ``basic`` envs
skipped (a browser start each).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _results import report  # noqa: E402

from tasks.records.suites.miniwob import PRESETS, instance_seed  # noqa: E402
from tasks.environments.browser.miniwob import MiniWoBSession  # noqa: E402

REF = re.compile(r'^\s*\[(\d+)\] (\S+)(?: "((?:[^"\\]|\\.)*)")?')


def _elements(text: str) -> list[tuple[int | None, str, str]]:
    out = []
    for line in text.splitlines()[1:]:
        m = REF.match(line)
        out.append((int(m.group(1)), m.group(2), m.group(3) or "") if m else (None, "t", line.strip().strip('"')))
    return out


def _policy(sess: MiniWoBSession) -> None:
    """A scripted solution of each ``basic`` env, reading only the text rendering."""
    text = sess.observe()
    utter, els = text.splitlines()[0], _elements(text)
    first = {tag.split("#")[0].split(".")[0]: ref for ref, tag, _ in reversed(els) if ref is not None}
    if sess.env == "click-button":
        want = re.search(r'"(.*)" button', utter).group(1)
        sess.click(str(next(r for r, tag, t in els if tag.startswith("button") and t == want)))
    elif sess.env == "click-link":
        want = re.search(r'link "(.*)"\.$', utter).group(1)
        sess.click(str(next(r for r, tag, t in els if r is not None and t == want)))
    elif sess.env == "focus-text":
        sess.click(str(first["input_text"]))
    elif sess.env == "enter-text":
        sess.type(str(first["input_text"]), re.search(r'Enter "(.*)" into', utter).group(1))
        sess.click(str(next(r for r, tag, t in els if tag.startswith("button") and t == "Submit")))
    elif sess.env == "click-checkboxes":
        words = re.search(r"Select (.*) and click Submit", utter).group(1)
        targets = set() if words == "nothing" else {w.strip() for w in words.split(",")}
        last = None
        for ref, tag, t in els:
            if ref is not None and tag.startswith("input_checkbox"):
                last = ref
            elif ref is None and last is not None:
                if t in targets:
                    sess.click(str(last))
                last = None
        sess.click(str(next(r for r, tag, t in els if tag.startswith("button") and t == "Submit")))
    else:
        raise ValueError(sess.env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--instances", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="enter-text only, one instance (one browser start)")
    args = ap.parse_args()
    envs = list(PRESETS["basic"])
    if args.smoke:
        envs, args.instances = ["enter-text"], 1
    starts, resets, clicks, types, observes, closes, rewards = [], [], [], [], [], [], {}
    for env in envs:
        sess = MiniWoBSession(env, instance_seed(0, env, 0))
        starts.append(sess.timings["start"])
        got = []
        for k in range(args.instances):
            if k:
                sess.reset(instance_seed(0, env, k))
                resets.append(sess.timings["reset"])
            t = time.perf_counter()
            sess.observe()
            observes.append(time.perf_counter() - t)
            _policy(sess)
            got.append(sess.reward())
        rewards[env] = statistics.mean(got)
        if env == "enter-text":  # action costs, on a fresh instance
            sess.reset(instance_seed(0, env, args.instances))
            ref = re.search(r"\[(\d+)\] input_text", sess.observe()).group(1)
            t = time.perf_counter()
            sess.type(ref, "hello")
            types.append(time.perf_counter() - t)
            t = time.perf_counter()
            sess.click(ref)
            clicks.append(time.perf_counter() - t)
        t = time.perf_counter()
        sess.close()
        closes.append(time.perf_counter() - t)
    report("miniwob_session", {
        "host": platform.node(), "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2),
        "instances_per_env": args.instances, "smoke": args.smoke, "envs": envs,
        "start_s_median": round(statistics.median(starts), 3), "start_s_max": round(max(starts), 3),
        "reset_s_median": round(statistics.median(resets), 3) if resets else None,
        "observe_s_median": round(statistics.median(observes), 3),
        "click_s": round(clicks[0], 3), "type_s": round(types[0], 3),
        "close_s_median": round(statistics.median(closes), 3),
        **{f"scripted_reward_{env}": round(r, 3) for env, r in rewards.items()},
    })


if __name__ == "__main__":
    main()
