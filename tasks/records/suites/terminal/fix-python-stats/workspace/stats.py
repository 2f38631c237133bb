"""Print count, mean and median of the numbers in a file (one per line; blank lines ignored)."""
import sys


def read_numbers(path):
    with open(path) as f:
        return [int(line) for line in f]


def mean(xs):
    return sum(xs) // len(xs)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main(path):
    xs = read_numbers(path)
    print(f"count={len(xs)} mean={mean(xs):.2f} median={median(xs):.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
