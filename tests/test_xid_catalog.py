"""exporter/xid/catalog.csv (NVIDIA's Xid catalog), its loader, and the script that derives it."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode_exporter.xid import catalog
from gpunode_exporter.xid.catalog import UNKNOWN, Entry, parse

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "xid_catalog.py"
PACKAGED = ROOT / "exporter" / "xid" / "catalog.csv"

# The immediate-action buckets NVIDIA's catalog uses (its "Resolution Bucket (Immediate
# Action)" column, retrieved 2026-11-22). A new one from NVIDIA fails the test on purpose:
# add it here and to docs/xid-catalog.md.
BUCKETS = {
    "CHECK_MECHANICALS", "CHECK_UVM", "CONTACT_SUPPORT", "IGNORE", "RESET_GPU", "RESTART_APP",
    "RESTART_BM", "RESTART_VM", "UPDATE_SWFW", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK_ERR",
    "WORKFLOW_XID_45", "WORKFLOW_XID_48", "XID_154",
}
# The codes the rule pack and docs name; all are in NVIDIA's table.
NAMED_CODES = {13, 31, 32, 38, 43, 45, 46, 48, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119,
               120, 121, 140, 143, *range(144, 151), *range(154, 159)}
ALL = frozenset({"A100", "H100", "B100", "GB200"})
R565 = "CUDA 12.7; GPU driver R565"

# What NVIDIA's table says: (mnemonic, immediate, investigatory, 154 linkage, applies to).
NVIDIA = {
    13: ("ROBUST_CHANNEL_GR_EXCEPTION / ROBUST_CHANNEL_GR_ERROR_SW_NOTIFY", "RESTART_APP",
         "WORKFLOW_XID_13", "", ALL),
    31: ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", "WORKFLOW_XID_31", "", ALL),
    43: ("ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", "CONTACT_SUPPORT", "", ALL),
    45: ("ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45",
         "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)", "", ALL),
    48: ("ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", "WORKFLOW_XID_48", R565, ALL),
    74: ("NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", R565, {"A100", "H100"}),
    79: ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "CONTACT_SUPPORT", R565, ALL),
    94: ("ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", "IGNORE (sympathetic)", R565, ALL),
    95: ("ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", "IGNORE (sympathetic)", R565, ALL),
    119: ("GSP_RPC_TIMEOUT", "RESET_GPU", "INVESTIGATE_SW", "", ALL),
    121: ("C2C_ERROR", "IGNORE", "CONTACT_SUPPORT", "", {"GB200"}),
    145: ("NVLINK_RLW_ERROR", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", R565, {"B100", "GB200"}),
    149: ("NVLINK_NETIR_ERROR", "WORKFLOW_NVLINK5_ERR", "WORKFLOW_NVLINK5_ERR", R565, {"B100", "GB200"}),
    154: ("GPU_RECOVERY_ACTION_CHANGED", "XID_154", "N/A Informational only regarding another Xid", "", ALL),
    158: ("GPU_FATAL_TIMEOUT", "RESET_GPU", "CONTACT_SUPPORT", "yes; support with Xid introduction", ALL),
}


def test_packaged_catalog_loads_whole_and_is_cached() -> None:
    cat = catalog.load()
    assert catalog.load() is cat
    assert cat.source == "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
    codes = [e.code for e in cat]
    assert codes == sorted(set(codes)) and len(codes) == len(cat)
    # NVIDIA's table ran 1..172 without gaps when it was copied; it only grows.
    assert set(codes) >= set(range(1, 173))
    assert set(codes) >= NAMED_CODES


def test_packaged_file_has_no_duplicate_codes_and_names_its_source() -> None:
    lines = PACKAGED.read_text(encoding="utf-8").splitlines()
    comments = [line for line in lines if line.startswith("#")]
    assert any("source: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in c for c in comments)
    assert any("retrieved 2026-11-22" in c for c in comments)
    assert any("scripts/xid_catalog.py" in c for c in comments)
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    codes = [int(row["code"]) for row in rows]
    assert len(codes) == len(set(codes)) == len(catalog.load())


def test_every_immediate_action_is_an_nvidia_bucket() -> None:
    cat = catalog.load()
    assert {e.immediate_action for e in cat if e.immediate_action} == BUCKETS
    # NVIDIA gives no bucket for its newest codes (power smoothing, CC, PCIe, DRAM/SRAM detail).
    assert {e.code for e in cat if not e.immediate_action} == set(range(162, 173))
    assert cat.action(162) == UNKNOWN


@pytest.mark.parametrize("code", sorted(NVIDIA))
def test_spot_checks_against_nvidia_table(code: int) -> None:
    mnemonic, immediate, investigatory, linkage, applies = NVIDIA[code]
    entry = catalog.load().entry(code)
    assert entry is not None
    assert (entry.mnemonic, entry.immediate_action, entry.investigatory_action, entry.xid154_linkage,
            entry.applies_to) == (mnemonic, immediate, investigatory, linkage, applies)
    assert catalog.load().action(code) == immediate


def test_description_with_a_comma_survives_quoting() -> None:
    entry = catalog.load().entry(45)
    assert entry is not None and entry.description.startswith("Preemptive cleanup, due to previous errors")


def test_unknown_code() -> None:
    cat = catalog.load()
    assert cat.entry(100000) is None
    assert cat.action(100000) == UNKNOWN
    assert cat.action(-1) == UNKNOWN


HEAD = "# source: https://example.invalid/xid\ncode,mnemonic,description,immediate_action,investigatory_action," \
       "xid154_linkage,a100,h100,b100,gb200\n"


def test_parse_reads_our_format(tmp_path: Path) -> None:
    text = HEAD + '79,FALLEN,"off the bus, gone",RESTART_BM,CONTACT_SUPPORT,x,1,0,0,1\n\n# trailing note\n'
    cat = parse(text)
    assert cat.source == "https://example.invalid/xid" and len(cat) == 1
    assert cat.entry(79) == Entry(79, "FALLEN", "off the bus, gone", "RESTART_BM", "CONTACT_SUPPORT", "x",
                                  frozenset({"A100", "GB200"}))
    path = tmp_path / "c.csv"
    path.write_text(text, encoding="utf-8")
    assert catalog.load(path).action(79) == "RESTART_BM"


@pytest.mark.parametrize(("rows", "line", "what"), [
    ("79,A,B,RESTART_BM,C,,1,1,1\n", 3, "9 fields"),
    ("79,A,B,RESTART_BM,C,,1,1,1,1\n79,A,B,IGNORE,C,,1,1,1,1\n", 4, "duplicate code 79"),
    ("79,A,B,restart_bm,C,,1,1,1,1\n", 3, "not an upper-case token"),
    ("79,A,B,RESTART BM,C,,1,1,1,1\n", 3, "not an upper-case token"),
    ("x79,A,B,RESTART_BM,C,,1,1,1,1\n", 3, "not a non-negative integer"),
    ("79,A,B,RESTART_BM,C,,1,YES,1,1\n", 3, "not all 0 or 1"),
])
def test_parse_rejects_bad_rows_naming_the_line(rows: str, line: int, what: str) -> None:
    with pytest.raises(ValueError, match=rf"line {line}: .*{what}"):
        parse(HEAD + rows)


def test_parse_rejects_a_missing_or_wrong_header() -> None:
    with pytest.raises(ValueError, match="line 1: expected the header"):
        parse("code,mnemonic\n1,X\n")
    with pytest.raises(ValueError, match="no header"):
        parse("# only a comment\n")


# --- the derivation script -----------------------------------------------------------------
# A few rows in the two shapes NVIDIA's table comes in. Trigger texts are ours, shortened.

PIPE_TABLE = """\
source: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html

For Ampere and newer GPUs, a catalog of possible Xid events is available below:

Type (XID) |
Code |
Mnemonic |
Description |
Applies to A100 |
Applies to H100 |
Applies to B100 |
Applies to GB200 |
Resolution Bucket (Immediate Action) |
Resolution Bucket (Investigatory Action) |
Xid 154 linkage |
Trigger Conditions |
|---|---|---|---|---|---|---|---|---|---|---|---|
XID |
1 |
ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD |
Unused |
NO |
NO |
NO |
NO |
CONTACT_SUPPORT |
N/A; Unused |
||
XID |
16 |
ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT |
Unused |
NO |
NO |
NO |
NO |
CONTACT_SUPPORT |
CONTACT_SUPPORT |
N/A; Unused |
|
XID |
45 |
ROBUST_CHANNEL_PREEMPTIVE_REMOVAL |
Preemptive cleanup, due to previous errors |
YES |
YES |
YES |
YES |
WORKFLOW_XID_45 |
Solo: RESTART_FM Not Solo: IGNORE (follow other Xid) |
Logged when an application is torn down,
for example on Control-C. |
|
XID |
79 |
ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS |
GPU has fallen off the bus |
YES |
YES |
YES |
YES |
RESTART_BM |
CONTACT_SUPPORT |
CUDA 12.7; GPU driver R565 |
The driver found the GPU unreachable over PCI Express. |
XID |
142 |
ROBUST_CHANNEL_NVENC3_ERROR |
NVENC3 Error |
NO |
NO |
NO |
YES |
CONTACT_SUPPORT |
|||
XID |
157 |
RESOURCE_RETIREMENT_FAILURE |
Resource Retirement Failure |
NO |
YES |
YES |
YES |
IGNORE |
CONTACT_SUPPORT |
No repair possible for lack of resources. |
|
XID |
163 |
PSHC_DISENGAGED |
Power Smoothing HW Circuitry capability disengaged |
NO |
NO |
YES |
YES |
No GPU reset required; resolve the thermal events. |
|||
XID |
172 |
UNCORRECTABLE_SRAM_ERROR |
Additional to Xid 48 providing more details |
YES |
YES |
YES |
YES |

Xid |
Subcode |
|---|---|
144 |
SAW_MVB |
"""

SHEET_CSV = """\
Xid Catalog,,,,,,,,,,,
Type (XID),Code,Mnemonic,Description,Applies to A100,Applies to H100,Applies to B100,Applies to GB200,\
Resolution Bucket (Immediate Action),Resolution Bucket (Investigatory Action),Xid 154 linkage,Trigger Conditions
XID,1,ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD,Unused,NO,NO,NO,NO,CONTACT_SUPPORT,N/A; Unused,,
XID,16,ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT,Unused,NO,NO,NO,NO,CONTACT_SUPPORT,CONTACT_SUPPORT,N/A; Unused,
XID,45,ROBUST_CHANNEL_PREEMPTIVE_REMOVAL,"Preemptive cleanup, due to previous errors",YES,YES,YES,YES,\
WORKFLOW_XID_45,Solo: RESTART_FM Not Solo: IGNORE (follow other Xid),,"Logged when an application is torn down,
for example on Control-C."
XID,79,ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS,GPU has fallen off the bus,YES,YES,YES,YES,\
RESTART_BM,CONTACT_SUPPORT,CUDA 12.7; GPU driver R565,The driver found the GPU unreachable over PCI Express.
XID,142,ROBUST_CHANNEL_NVENC3_ERROR,NVENC3 Error,NO,NO,NO,YES,CONTACT_SUPPORT,,,
XID,157,RESOURCE_RETIREMENT_FAILURE,Resource Retirement Failure,NO,YES,YES,YES,IGNORE,CONTACT_SUPPORT,,\
No repair possible for lack of resources.
XID,163,PSHC_DISENGAGED,Power Smoothing HW Circuitry capability disengaged,NO,NO,YES,YES,,,,\
No GPU reset required; resolve the thermal events.
XID,172,UNCORRECTABLE_SRAM_ERROR,Additional to Xid 48 providing more details,YES,YES,YES,YES,,,,
,,,,,,,,,,,
"""

EXPECTED = """\
code,mnemonic,description,immediate_action,investigatory_action,xid154_linkage,a100,h100,b100,gb200
1,ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD,Unused,CONTACT_SUPPORT,N/A; Unused,,0,0,0,0
16,ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT,Unused,CONTACT_SUPPORT,CONTACT_SUPPORT,N/A; Unused,0,0,0,0
45,ROBUST_CHANNEL_PREEMPTIVE_REMOVAL,"Preemptive cleanup, due to previous errors",WORKFLOW_XID_45,\
Solo: RESTART_FM Not Solo: IGNORE (follow other Xid),,1,1,1,1
79,ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS,GPU has fallen off the bus,RESTART_BM,CONTACT_SUPPORT,\
CUDA 12.7; GPU driver R565,1,1,1,1
142,ROBUST_CHANNEL_NVENC3_ERROR,NVENC3 Error,CONTACT_SUPPORT,,,0,0,0,1
157,RESOURCE_RETIREMENT_FAILURE,Resource Retirement Failure,IGNORE,CONTACT_SUPPORT,,0,1,1,1
163,PSHC_DISENGAGED,Power Smoothing HW Circuitry capability disengaged,,,,0,0,1,1
172,UNCORRECTABLE_SRAM_ERROR,Additional to Xid 48 providing more details,,,,1,1,1,1
"""


def run_script(tmp_path: Path, name: str, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return subprocess.run([sys.executable, str(SCRIPT), str(path), "--retrieved", "2026-11-22", *args],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("name", "text", "origin"), [
    ("page.txt", PIPE_TABLE, "from a stored copy"),
    ("Xids.csv", SHEET_CSV, "from NVIDIA's spreadsheet"),
])
def test_script_derives_our_rows_from_either_shape(tmp_path: Path, name: str, text: str, origin: str) -> None:
    done = run_script(tmp_path, name, text)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines(keepends=True)
    comments = [line for line in lines if line.startswith("#")]
    assert "".join(line for line in lines if not line.startswith("#")) == EXPECTED
    assert comments[1] == "# source: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html\n"
    assert f"retrieved 2026-11-22 {origin}" in comments[2] and "none shown" in comments[2]
    cat = parse(done.stdout)  # the loader takes what the script writes
    assert cat.action(79) == "RESTART_BM" and cat.action(163) == UNKNOWN and len(cat) == 8


def test_script_writes_out_file_with_version(tmp_path: Path) -> None:
    out = tmp_path / "catalog.csv"
    done = run_script(tmp_path, "page.txt", PIPE_TABLE, "--version", "v9 (2030-01-01)", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "# catalog version: v9 (2030-01-01); retrieved 2026-11-22" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize(("name", "text", "complaint"), [
    ("page.txt", PIPE_TABLE.replace("YES |\nRESTART_BM", "MAYBE |\nRESTART_BM"), "Xid 79: applies-to flag 'MAYBE'"),
    ("page.txt", PIPE_TABLE.replace("NVENC3 Error |\n", "NVENC3 Error |\nEXTRA |\n"), "Xid 142: 13 cells"),
    ("page.txt", PIPE_TABLE.replace("Xid 154 linkage |\n", ""), "NVIDIA changed the table"),
    ("Xids.csv", SHEET_CSV.replace("XID,16,", "XID,16,X,").replace(",N/A; Unused,\n", ",N/A; Unused\n"),
     "row 4: Xid 16: applies-to flag 'Unused'"),
    ("Xids.csv", SHEET_CSV + "XID,79,DUP,d,YES,YES,YES,YES,IGNORE,,,\n", "Xid 79 appears twice"),
])
def test_script_refuses_a_table_it_cannot_read(tmp_path: Path, name: str, text: str, complaint: str) -> None:
    done = run_script(tmp_path, name, text)
    assert done.returncode == 1
    assert complaint in done.stderr
    assert done.stdout == ""
