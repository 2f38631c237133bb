from pathlib import Path

TOP = [('garden', 70), ('lantern', 62), ('harbor', 59), ('quiet', 52), ('light', 43), ('window', 40), ('shadow', 38), ('morning', 34), ('stone', 21), ('silver', 16)]


def got():
    return [l.split() for l in Path("/app/top_words.txt").read_text().strip().splitlines()]


def test_ten_lines():
    assert len(got()) == 10


def test_no_stopwords():
    assert not {w for w, _ in got()} & set(['a', 'and', 'in', 'of', 'the', 'to'])


def test_most_frequent_word():
    assert got()[0] == [TOP[0][0], str(TOP[0][1])]


def test_full_ranking():
    assert got() == [[w, str(n)] for w, n in TOP]
