"""Rollout memory of the two likelihood estimators at the NOVA and Harmon presets (B images per
rank, the preset's K, mask steps, recorded steps), from Rollout.footprint (tests/test_rollout.py
checks it against Rollout.nbytes): `transition` keeps R x P_j recorded transitions of K + 1
trajectories per recorded mask step; `matching` keeps none, only the tokens, order and images, and
its update draws D (time, noise) pairs per committed token of the recorded steps.

    python benchmarks/estimator_memory.py
"""

from __future__ import annotations

from margrpo.rollout import mask_schedule
from margrpo.rollout.record import Rollout

# name, schedule, images per rank per step, K, C, N, recorded mask steps, recorded diffusion steps, image side
PRESETS = [("nova-512", "nova", 12, 3, 16, 1024, 12, 10, 512), ("harmon-1.5b", "harmon", 4, 5, 16, 1024, 12, 10, 512)]
MATCHING_DRAWS = 4


def mean_positions(N: int, steps: int, schedule: str) -> tuple[float, float]:
    """(revealed, unknown) positions of an average effective mask step: what a recorded step scores."""
    counts, start, revealed, unknown = mask_schedule(N, steps, schedule), 0, [], []
    for n in counts:
        if n:
            revealed.append(n)
            unknown.append(N - start)
        start += n
    return sum(revealed) / len(revealed), sum(unknown) / len(unknown)


def main() -> None:
    print("| preset | likelihood positions | transition rollout | matching rollout | matching draws (D = 4) |")
    print("|---|---|---|---|---|")
    for name, schedule, B, K, C, N, M, R, side in PRESETS:
        revealed, unknown = mean_positions(N, 64, schedule)
        for mode, positions in (("unknown", unknown), ("revealed", revealed)):
            L = round(R * M * positions)
            transition = Rollout.footprint(B, N, C, K, side, side, L, M, mode == "unknown")
            matching = Rollout.footprint(B, N, C, K, side, side, 0, M, mode == "unknown")
            draws = MATCHING_DRAWS * B * round(M * revealed) * (C + 1) * 4
            print(
                f"| {name} (B={B}, K={K}) | {mode} | {transition / 2**20:.0f} MiB | {matching / 2**20:.0f} MiB | {draws / 2**20:.2f} MiB |"
            )


if __name__ == "__main__":
    main()
