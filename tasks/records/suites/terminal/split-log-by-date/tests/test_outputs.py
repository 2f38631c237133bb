from pathlib import Path

BY = {'2024-05-02': ['2024-05-02 00:00:00 event=0 user=ben', '2024-05-02 03:03:00 event=3 user=ben', '2024-05-02 04:04:00 event=4 user=cid', '2024-05-02 05:05:00 event=5 user=ann', '2024-05-02 08:08:00 event=8 user=ann', '2024-05-02 09:09:00 event=9 user=cid', '2024-05-02 17:17:00 event=17 user=cid', '2024-05-02 20:20:00 event=20 user=cid', '2024-05-02 23:23:00 event=23 user=cid', '2024-05-02 01:25:00 event=25 user=ann', '2024-05-02 02:26:00 event=26 user=ann', '2024-05-02 15:39:00 event=39 user=cid', '2024-05-02 18:42:00 event=42 user=cid', '2024-05-02 01:49:00 event=49 user=cid', '2024-05-02 03:51:00 event=51 user=ben', '2024-05-02 04:52:00 event=52 user=cid', '2024-05-02 08:56:00 event=56 user=ann', '2024-05-02 09:57:00 event=57 user=cid'], '2024-04-30': ['2024-04-30 01:01:00 event=1 user=cid', '2024-04-30 07:07:00 event=7 user=ann', '2024-04-30 11:11:00 event=11 user=cid', '2024-04-30 12:12:00 event=12 user=ann', '2024-04-30 14:14:00 event=14 user=cid', '2024-04-30 22:22:00 event=22 user=ann', '2024-04-30 04:28:00 event=28 user=cid', '2024-04-30 05:29:00 event=29 user=ann', '2024-04-30 07:31:00 event=31 user=ben', '2024-04-30 09:33:00 event=33 user=ben', '2024-04-30 10:34:00 event=34 user=ben', '2024-04-30 13:37:00 event=37 user=ann', '2024-04-30 14:38:00 event=38 user=ann', '2024-04-30 00:48:00 event=48 user=ben', '2024-04-30 06:54:00 event=54 user=cid', '2024-04-30 07:55:00 event=55 user=cid', '2024-04-30 11:59:00 event=59 user=cid'], '2024-05-03': ['2024-05-03 02:02:00 event=2 user=ben', '2024-05-03 13:13:00 event=13 user=cid', '2024-05-03 16:16:00 event=16 user=ann', '2024-05-03 21:21:00 event=21 user=ben', '2024-05-03 06:30:00 event=30 user=ann', '2024-05-03 08:32:00 event=32 user=ben', '2024-05-03 11:35:00 event=35 user=ann', '2024-05-03 16:40:00 event=40 user=cid', '2024-05-03 19:43:00 event=43 user=ben', '2024-05-03 20:44:00 event=44 user=cid', '2024-05-03 21:45:00 event=45 user=ann'], '2024-05-01': ['2024-05-01 06:06:00 event=6 user=ben', '2024-05-01 10:10:00 event=10 user=ben', '2024-05-01 15:15:00 event=15 user=cid', '2024-05-01 18:18:00 event=18 user=ann', '2024-05-01 19:19:00 event=19 user=ben', '2024-05-01 00:24:00 event=24 user=ben', '2024-05-01 03:27:00 event=27 user=ann', '2024-05-01 12:36:00 event=36 user=ann', '2024-05-01 17:41:00 event=41 user=ann', '2024-05-01 22:46:00 event=46 user=ann', '2024-05-01 23:47:00 event=47 user=ann', '2024-05-01 02:50:00 event=50 user=cid', '2024-05-01 05:53:00 event=53 user=ben', '2024-05-01 10:58:00 event=58 user=ben']}
D = Path("/app/by_date")


def test_one_file_per_date():
    assert sorted(p.name for p in D.glob("*.log")) == sorted(f"{d}.log" for d in BY)


def test_lines_in_order():
    for d, ls in BY.items():
        assert (D / f"{d}.log").read_text().splitlines() == ls


def test_index():
    assert (D / "index.txt").read_text().splitlines() == [f"{d} {len(BY[d])}" for d in sorted(BY)]
