"""A tiny 'agent' for the README: counts words in the workspace, slowly, so you can detach."""

import pathlib
import time

for path in sorted(pathlib.Path(".").glob("*.txt")):
    words = len(path.read_text().split())
    print(f"{path.name}: {words} words", flush=True)
    time.sleep(0.5)
print("done")
