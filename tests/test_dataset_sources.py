"""Dataset sources: a user's index file read as rows, and VLM records rewritten into a model's `attr` shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mm_agent.dataset.conversations import Attr, media_of, placeholders, to_mllm
from mm_agent.dataset.index_files import IndexRow, read_index
from mm_agent.dataset.limits import Refusal
from mm_agent.errors import MMAgentError


def rows(path: Path, path_column: str | None = None, caption_column: str | None = None) -> list[IndexRow]:
    return list(read_index(path, path_column=path_column, caption_column=caption_column))


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


# --- index files ---------------------------------------------------------------------------------------------


def test_csv_semicolon_delimiter_detects_columns(tmp_path: Path) -> None:
    index = write(tmp_path / "clips.csv", 'Video_Path;Caption;fps\na.mp4;  a cat ;24\n"b;c.mp4";;30\n')
    got = rows(index)
    assert [(r.line, r.media, r.caption, r.error) for r in got] == [
        (1, ["a.mp4"], "a cat", None),
        (2, ["b;c.mp4"], None, None),
    ]
    assert got[0].record == {"Video_Path": "a.mp4", "Caption": "  a cat ", "fps": "24"}


def test_tsv_with_bom_and_named_columns(tmp_path: Path) -> None:
    index = write(tmp_path / "clips.tsv", "\ufeffclip_file\tsummary\nx.mp4\tdog runs\n")
    got = rows(index, path_column="CLIP_FILE", caption_column="summary")
    assert [(r.media, r.caption) for r in got] == [(["x.mp4"], "dog runs")]


def test_csv_row_with_extra_fields_is_an_error_row(tmp_path: Path) -> None:
    index = write(tmp_path / "clips.csv", "path,cap\na.mp4,ok\nb.mp4,one, two\nc.mp4,\n")
    got = rows(index)
    assert got[0].error is None and got[2].error is None and got[2].caption is None
    assert got[1].error is not None and "3 fields where the header has 2" in got[1].error


def test_jsonl_broken_line_does_not_stop(tmp_path: Path) -> None:
    lines = [
        json.dumps({"file": "a.mp4", "captions": ["", " first ", "second"]}),
        '{"file": "b.mp4", "cap": ',
        "",
        json.dumps(["not", "an", "object"]),
        json.dumps({"file": "", "text": "no path"}),
        json.dumps({"file": 3}),
        json.dumps({"file": "c.mp4"}),
    ]
    got = rows(write(tmp_path / "data.jsonl", "\n".join(lines) + "\n"))
    assert [r.line for r in got] == [1, 2, 4, 5, 6, 7]
    assert (got[0].media, got[0].caption, got[0].error) == (["a.mp4"], "first", None)
    assert got[1].error is not None and got[1].error.startswith("not JSON")
    assert got[2].error == "a JSON list, not an object"
    assert got[3].error == "no path in column 'file'"
    assert got[4].error == "'file' is a int, not a path"
    assert (got[5].media, got[5].caption, got[5].error) == (["c.mp4"], None, None)


def test_json_list_and_dict_holding_one_list(tmp_path: Path) -> None:
    records = [{"image": ["p/1.jpg", "p/2.jpg"], "prompt": "two"}, 7]
    plain = rows(write(tmp_path / "a.json", json.dumps(records, indent=2)))
    wrapped = rows(write(tmp_path / "b.json", json.dumps({"version": 1, "items": records})))
    for got in (plain, wrapped):
        assert (got[0].media, got[0].caption) == (["p/1.jpg", "p/2.jpg"], "two")
        assert got[1].error == "a JSON int, not an object"


def test_json_suffix_holding_jsonl(tmp_path: Path) -> None:
    index = write(tmp_path / "data.json", '{"path": "a.mp4", "cap": "x"}\n{"path": "b.mp4", "cap": "y"}\n')
    assert [r.media for r in rows(index)] == [["a.mp4"], ["b.mp4"]]


def test_json_dict_with_several_lists_is_refused(tmp_path: Path) -> None:
    index = write(tmp_path / "a.json", json.dumps({"train": [], "val": []}))
    with pytest.raises(MMAgentError, match="holding 2 lists") as err:
        rows(index)
    assert err.value.file == str(index) and err.value.fix and "JSON list" in err.value.fix


def test_json_over_the_size_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mm_agent.dataset.index_files.MAX_JSON_BYTES", 10)
    index = write(tmp_path / "big.json", json.dumps([{"path": "a.mp4"}]))
    with pytest.raises(MMAgentError, match="too large") as err:
        rows(index)
    assert err.value.file == str(index) and err.value.fix and "JSONL" in err.value.fix


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    index = write(tmp_path / "clips.csv", "path,cap\na.mp4,café crème\n", encoding="cp1252")
    with pytest.raises(MMAgentError, match="not UTF-8") as err:
        rows(index)
    assert err.value.file == str(index) and err.value.fix and "UTF-8" in err.value.fix


def test_named_column_that_does_not_exist(tmp_path: Path) -> None:
    index = write(tmp_path / "clips.csv", "path,cap\na.mp4,x\n")
    with pytest.raises(MMAgentError, match="no column 'caption_en'; it has: 'path', 'cap'") as err:
        rows(index, caption_column="caption_en")
    assert err.value.file == str(index) and err.value.fix and "--caption-column" in err.value.fix
    with pytest.raises(MMAgentError, match="no column 'src'") as err:
        rows(index, path_column="src")
    assert err.value.fix and "--path-column" in err.value.fix


def test_no_path_column_is_refused(tmp_path: Path) -> None:
    index = write(tmp_path / "clips.jsonl", json.dumps({"url": "a.mp4", "cap": "x"}) + "\n")
    with pytest.raises(MMAgentError, match=r"no path column.*it has: 'url', 'cap'") as err:
        rows(index)
    assert err.value.fix and "--path-column" in err.value.fix


def test_conversation_records_need_no_path_column(tmp_path: Path) -> None:
    records = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": "a.jpg"}, {"type": "text", "text": "?"}],
                },
                {"role": "assistant", "content": "a cat"},
            ]
        },
    ]
    got = rows(write(tmp_path / "chat.json", json.dumps(records)))
    assert [(r.media, r.error) for r in got] == [([], None), (["a.jpg"], None)]
    assert got[1].record == records[1]


def test_unknown_suffix_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(MMAgentError, match=r"unknown index format '\.xlsx'"):
        rows(write(tmp_path / "a.xlsx", "x"))
    with pytest.raises(MMAgentError, match="no records"):
        rows(write(tmp_path / "empty.jsonl", "\n\n"))
    with pytest.raises(MMAgentError, match="no such file") as err:
        rows(tmp_path / "gone.csv")
    assert err.value.file == str(tmp_path / "gone.csv")


def test_only_broken_records_yield_error_rows(tmp_path: Path) -> None:
    got = rows(write(tmp_path / "bad.jsonl", "{oops\n[1]\n"))
    assert [(r.line, r.error is not None) for r in got] == [(1, True), (2, True)]


def test_csv_streams(tmp_path: Path) -> None:
    index = write(tmp_path / "big.csv", "path\n" + "".join(f"{i}.mp4\n" for i in range(1000)))
    stream = read_index(index, path_column=None, caption_column=None)
    assert next(stream).media == ["0.mp4"]
    assert sum(1 for _ in stream) == 999


# --- conversations -------------------------------------------------------------------------------------------

QWEN = Attr()  # the stock Qwen2.5-VL attr: messages/images, role/content, user/assistant, no system tag
QWEN_SYSTEM = Attr(system_tag="system")


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def bot(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def test_attr_from_config_reads_the_block_and_fills_mindspeed_defaults() -> None:
    stock = {
        "dataset_param": {
            "attr": {
                "system": None,
                "images": "images",
                "videos": None,
                "messages": "messages",
                "role_tag": "role",
                "content_tag": "content",
                "user_tag": "user",
                "assistant_tag": "assistant",
                "observation_tag": None,
                "function_tag": None,
                "system_tag": None,
            }
        }
    }
    assert Attr.from_config(stock) == QWEN
    bare = Attr.from_config({"dataset_param": {"attr": {"images": "images"}}})
    assert (bare.messages, bare.role_tag, bare.content_tag, bare.user_tag, bare.assistant_tag) == (
        "conversations",
        "from",
        "value",
        "human",
        "gpt",
    )
    assert (bare.system_tag, bare.videos, bare.formatting) == ("system", None, "sharegpt")
    assert Attr.from_config({}).images is None


def test_attr_from_config_refuses_unusable_blocks() -> None:
    with pytest.raises(MMAgentError, match="sharegpt") as err:
        Attr.from_config({"dataset_param": {"attr": {"formatting": "alpaca"}}})
    assert err.value.field == "dataset_param.attr.formatting"
    with pytest.raises(MMAgentError) as err:
        Attr.from_config({"dataset_param": {"attr": {"role_tag": None}}})
    assert err.value.field == "dataset_param.attr.role_tag" and err.value.fix


def test_placeholders_counts() -> None:
    assert placeholders("<image><image>what <video>?") == (2, 1)
    assert placeholders("none") == (0, 0)


def test_llava_record() -> None:
    record = {
        "id": "1",
        "image": "coco/1.jpg",
        "conversations": [
            {"from": "human", "value": "<image>\nWhat is this?"},
            {"from": "gpt", "value": "A cat."},
            {"from": "human", "value": "Colour?"},
            {"from": "gpt", "value": "Grey."},
        ],
    }
    assert media_of(record) == ["coco/1.jpg"]
    assert to_mllm(record, QWEN) == {
        "messages": [user("<image>\nWhat is this?"), bot("A cat."), user("Colour?"), bot("Grey.")],
        "images": ["coco/1.jpg"],
    }


def test_sharegpt_record_without_placeholders_gets_them_inserted() -> None:
    record = {
        "messages": [{"from": "user", "value": "Compare."}, {"from": "assistant", "value": "Same."}],
        "images": ["a.jpg", "b.jpg"],
    }
    assert to_mllm(record, QWEN) == {
        "messages": [user("<image><image>Compare."), bot("Same.")],
        "images": ["a.jpg", "b.jpg"],
    }


def test_openai_parts_record_into_default_dataset_attr() -> None:
    record = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A dog."}]},
        ],
        "images": ["d.jpg"],
    }
    attr = Attr.from_config({"dataset_param": {"attr": {"images": "pics"}}})  # DatasetAttr defaults elsewhere
    assert to_mllm(record, attr) == {
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "<image>What?"},
            {"from": "gpt", "value": "A dog."},
        ],
        "pics": ["d.jpg"],
    }


def test_system_prompt_goes_where_the_attr_reads_it() -> None:
    turns = [{"role": "system", "content": "S"}, user("q"), bot("a")]
    assert to_mllm({"messages": turns}, QWEN_SYSTEM) == {
        "messages": [{"role": "system", "content": "S"}, user("q"), bot("a")],
        "images": [],
    }
    column = Attr(system="system_prompt")
    assert to_mllm({"messages": turns}, column) == {
        "system_prompt": "S",
        "messages": [user("q"), bot("a")],
        "images": [],
    }
    assert to_mllm({"messages": turns[1:]}, column) == {  # the column is always written: one schema
        "system_prompt": None,
        "messages": [user("q"), bot("a")],
        "images": [],
    }
    refused = to_mllm({"messages": turns}, QWEN)
    assert isinstance(refused, Refusal) and refused.code == "system_unsupported"
    assert "system_tag" in refused.fix


def test_videos_need_a_videos_attr() -> None:
    record = {"messages": [user("<video>Describe."), bot("Rain.")], "videos": "v.mp4"}
    video_attr = Attr(images=None, videos="videos")
    assert to_mllm(record, video_attr) == {
        "messages": [user("<video>Describe."), bot("Rain.")],
        "videos": ["v.mp4"],
    }
    assert media_of(record) == ["v.mp4"]
    refused = to_mllm(record, QWEN)
    assert isinstance(refused, Refusal) and refused.code == "no_videos_in_model"


def test_media_key_hint_names_the_index_column() -> None:
    record = {"pic": ["x.jpg"], "messages": [user("<image>hi"), bot("yo")]}
    assert to_mllm(record, QWEN, media_key_hint="pic") == {
        "messages": [user("<image>hi"), bot("yo")],
        "images": ["x.jpg"],
    }


@pytest.mark.parametrize(
    ("record", "attr", "code"),
    [
        ({"image": "a.jpg"}, QWEN, "no_conversation"),
        ({"messages": []}, QWEN, "no_conversation"),
        ({"messages": [user("q"), {"role": "tool", "content": "x"}]}, QWEN, "bad_role"),
        ({"messages": ["q", bot("a")]}, QWEN, "bad_role"),
        ({"messages": [user("  "), bot("a")]}, QWEN, "empty_turn"),
        ({"messages": [user("q"), {"role": "assistant", "content": 3}]}, QWEN, "empty_turn"),
        (
            {"messages": [user("q"), bot("a"), {"role": "user", "content": [{"type": "audio"}]}]},
            QWEN,
            "empty_turn",
        ),
        ({"messages": [bot("a"), user("q")]}, QWEN, "turn_order"),
        ({"messages": [user("q"), bot("a"), user("q2")]}, QWEN, "turn_order"),
        ({"messages": [user("q"), user("q2"), bot("a")]}, QWEN, "turn_order"),
        ({"messages": [user("q"), {"role": "system", "content": "S"}, bot("a")]}, QWEN_SYSTEM, "turn_order"),
        ({"messages": [{"role": "system", "content": "S"}]}, QWEN_SYSTEM, "turn_order"),
        ({"messages": [user("<image><image>q"), bot("a")], "images": ["a.jpg"]}, QWEN, "image_placeholders"),
        (
            {"messages": [user("<image>q"), bot("a")], "images": ["a.jpg", "b.jpg", "c.jpg"]},
            QWEN,
            "image_placeholders",
        ),
        ({"messages": [user("<image>q"), bot("a")]}, QWEN, "image_placeholders"),
        (
            {"messages": [user("<video>q"), bot("a")], "videos": []},
            Attr(videos="videos"),
            "video_placeholders",
        ),
        ({"messages": [user("q"), bot("a")], "images": ["a.jpg"]}, Attr(images=None), "no_images_in_model"),
        ({"messages": [user("q"), bot("a")], "images": [1]}, QWEN, "bad_media"),
        (
            {
                "messages": [{"role": "system", "content": "<image>"}, user("q"), bot("a")],
                "images": ["a.jpg"],
            },
            QWEN_SYSTEM,
            "placeholder_in_system",
        ),
    ],
)
def test_refusals(record: dict[str, Any], attr: Attr, code: str) -> None:
    refused = to_mllm(record, attr)
    assert isinstance(refused, Refusal), refused
    assert refused.code == code
    assert refused.reason and refused.fix
