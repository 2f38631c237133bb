from pathlib import Path

EXPECTED = {'2023-01-05_001.jpg': 'jpeg-bytes-20230105-1-249523\n', '2023-01-05_002.jpg': 'jpeg-bytes-20230105-2-621429\n', '2023-01-05_003.jpg': 'jpeg-bytes-20230105-3-570665\n', '2023-02-12_001.jpg': 'jpeg-bytes-20230212-1-136758\n', '2023-02-12_002.jpg': 'jpeg-bytes-20230212-2-387926\n', '2022-12-31_001.jpg': 'jpeg-bytes-20221231-1-960437\n', '2023-03-01_001.jpg': 'jpeg-bytes-20230301-1-633256\n', '2023-03-01_002.jpg': 'jpeg-bytes-20230301-2-497081\n'}
PHOTOS = Path("/app/photos")


def test_no_old_names_left():
    assert PHOTOS.is_dir() and not list(PHOTOS.glob("IMG_*"))


def test_new_names_exist():
    assert sorted(p.name for p in PHOTOS.glob("*.jpg")) == sorted(EXPECTED)


def test_contents_kept():
    for name, text in EXPECTED.items():
        assert (PHOTOS / name).read_text() == text


def test_other_files_untouched():
    assert (PHOTOS / "notes.txt").read_text() == "keep me as I am\n"
