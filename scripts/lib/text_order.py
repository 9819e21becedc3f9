"""The pages of a binary that processes touched, and the symbols on them.

    text_order.py snapshot PID BINARY >> PAGES   # the file offsets of BINARY's pages PID has mapped
    text_order.py symbols BINARY PAGES > ORDER   # the symbols on those pages, in address order
    text_order.py merge ORDER... > ORDER         # the symbols most lists name first, in order

Used by scripts/text-order, which makes the pages mapped the pages touched (page cache
dropped, readahead off) before the processes run.
"""

import struct
import subprocess
import sys

PAGE = 4096


def snapshot(pid: str, binary: str) -> None:
    """Prints the file offset of every page of BINARY's mappings that PID has present."""
    maps = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == binary:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                maps.append((lo, hi, int(parts[2], 16)))
    if not maps:
        sys.exit(f"text_order.py: process {pid} has no mapping of {binary}")
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for lo, hi, offset in maps:
            count = (hi - lo) // PAGE
            pagemap.seek(lo // PAGE * 8)
            entries = pagemap.read(count * 8)
            for i in range(count):
                (entry,) = struct.unpack_from("<Q", entries, i * 8)
                if entry >> 63 & 1:
                    print(offset + i * PAGE)


def symbols(binary: str, pages_file: str) -> None:
    """Prints the (mangled) names of the symbols on the touched pages, by address."""
    loads = []
    header = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True)
    for line in header.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == "LOAD":
            loads.append((int(parts[1], 16), int(parts[2], 16), int(parts[4], 16)))
    pages = set()
    with open(pages_file) as f:
        for line in f:
            offset = int(line)
            for file_offset, vaddr, size in loads:
                if file_offset <= offset < file_offset + size:
                    pages.add((vaddr + offset - file_offset) // PAGE)
    table = subprocess.run(
        ["nm", "-n", "-S", "--defined-only", binary], capture_output=True, text=True, check=True
    )
    seen = set()
    for line in table.stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 4 or len(parts[2]) != 1 or parts[2] in "aAuU":
            continue
        start, size, name = int(parts[0], 16), int(parts[1], 16), parts[3].strip()
        if size == 0 or name in seen:
            continue
        # Code runs from its entry: a function whose first page nobody touched did not
        # run, whatever of its tail shares a page with the next. Data is read anywhere.
        code = parts[2] in "tTwW"
        last = start // PAGE if code else (start + size - 1) // PAGE
        if any(p in pages for p in range(start // PAGE, last + 1)):
            seen.add(name)
            print(name)


def merge(orders: list[str]) -> None:
    """Prints the symbols of several orders: those in all of them first, then those in one
    fewer, and so on; within each, in the order they first appear."""
    count: dict[str, int] = {}
    for order in orders:
        with open(order) as f:
            for line in f:
                name = line.strip()
                if name:
                    count[name] = count.get(name, 0) + 1
    for name, _ in sorted(count.items(), key=lambda item: -item[1]):
        print(name)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "snapshot":
        snapshot(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "symbols":
        symbols(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "merge":
        merge(sys.argv[2:])
    else:
        sys.exit(__doc__)
