"""Prints the memory mapping a 1 MiB torch tensor lives in and its VmFlags (test_launcher.py)."""
import sys

import torch

# A line is one write (the ranks share one pipe; unbuffered, print writes its parts apart).
sys.stdout.reconfigure(line_buffering=True, write_through=False)

if "--init" in sys.argv:  # started without horovodliterun: horovodlite's init tunes malloc
    import horovodlite.torch as hvd

    hvd.init()
t = torch.ones(262144)  # 1 MiB: below torch's own huge-page threshold
addr = t.data_ptr()
cur = None
for line in open("/proc/self/smaps"):
    parts = line.split()
    if "-" in parts[0] and len(parts) >= 5 and ":" not in parts[0]:
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        cur = (lo <= addr < hi, line.strip())
    elif parts[0] == "VmFlags:" and cur and cur[0]:
        print("tensor mapping:", cur[1][:80], "| flags:", " ".join(parts[1:]))
