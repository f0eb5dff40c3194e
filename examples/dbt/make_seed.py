"""Write seeds/user_items.csv: synthetic, deterministic user-item pairs.

Every one of the 2000 users holds 'common'; every 4th user holds 'popular_a' and
every 5th 'popular_b'; every odd-numbered user also holds one item nobody else
has ('rare_0001', ...). At epsilon = 1 the three shared items are released and
the one-user items are not.
"""
import csv
from pathlib import Path

USERS = 2000


def rows():
    for user in range(1, USERS + 1):
        yield user, "common"
        if user % 4 == 0:
            yield user, "popular_a"
        if user % 5 == 0:
            yield user, "popular_b"
        if user % 2 == 1:
            yield user, f"rare_{user:04d}"


if __name__ == "__main__":
    out = Path(__file__).parent / "seeds" / "user_items.csv"
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["user_id", "item"])
        writer.writerows(rows())
