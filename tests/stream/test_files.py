"""Files written whole: a reader sees the old file or the new one, never half of one, and a failed write leaves
nothing behind."""
import json

import numpy as np
import pytest
from PIL import Image

from framegraph.stream.files import partial_name, write_json, written_whole


def test_partial_name_keeps_the_extension_writers_choose_the_format_by():
    assert partial_name("/x/take.mp4") == "/x/take.partial.mp4"
    assert partial_name("/x/matte.npz") == "/x/matte.partial.npz"
    assert partial_name("/x/report") == "/x/report.partial"


def test_the_file_appears_only_when_the_block_ends(tmp_path):
    path = tmp_path / "matte.npz"
    with written_whole(path) as tmp:
        np.savez_compressed(tmp, alpha=np.full((2, 3), 7, np.uint8))  # np.savez adds ".npz" to other names
        assert tmp.exists() and not path.exists()
    assert not tmp.exists()
    with np.load(path) as z:
        assert z["alpha"].tolist() == [[7, 7, 7], [7, 7, 7]]
    picture = tmp_path / "portrait.png"
    with written_whole(picture) as tmp:
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp)  # PIL picks PNG from the name
    assert Image.open(picture).format == "PNG"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_partial(tmp_path):
    path = write_json(tmp_path / "sub" / "report.json", {"frames": np.int64(3)})
    assert json.loads(path.read_text()) == {"frames": 3}
    with pytest.raises(RuntimeError, match="disk full"), written_whole(path) as tmp:
        tmp.write_text('{"fra')
        raise RuntimeError("disk full")
    assert json.loads(path.read_text()) == {"frames": 3}
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json"]
