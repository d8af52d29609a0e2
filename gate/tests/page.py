#!/usr/bin/env python3
"""The replay page in a real headless Chromium (Debian's chromium + chromium-driver,
driven by Selenium with Service('/usr/bin/chromedriver'): no Selenium Manager, no
download). Run by gate/tests/page.rs:

    page.py PAGE.html RUN.json SCREENSHOT.png

PAGE.html and RUN.json are the same run (`drainit-gate model --html PAGE --json`).
Asserts what a person sees: the request table and the ledger after "Next event",
after moving the inspection-time scrubber, after Restart and Play; saves a
screenshot and fails when it is blank. Prints one line per check; exits non-zero
on the first failure.
"""

import json
import pathlib
import struct
import sys
import time
import zlib

from selenium.webdriver.common.by import By

from browser import check, start

PAGE, RUN, SHOT = sys.argv[1], sys.argv[2], sys.argv[3]
run = json.loads(pathlib.Path(RUN).read_text())


def expected_at(t):
    """Every request's state at inspection time t, from the JSON rows (not from
    the page): waiting before its arrival, running between an admission and its
    end, else its outcome."""
    states = {}
    for r in run["requests"]:
        if t < r["arrived_s"]:
            s = "waiting"
        elif r["status"] in ("rejected", "failed") or t >= r["end_s"]:
            s = r["status"]
        else:
            s = "running"
        states[r["id"]] = s
    return states


def counts(states):
    c = {k: 0 for k in ("committed", "rejected", "failed", "killed", "running", "waiting")}
    for s in states.values():
        c[s] += 1
    return c


driver, quit_browser = start()
try:
    driver.get(pathlib.Path(PAGE).resolve().as_uri())
    find = driver.find_element
    text = lambda id_: find(By.ID, id_).text.strip()

    def table():
        rows = {}
        for tr in driver.find_elements(By.CSS_SELECTOR, "#requests tbody tr"):
            cells = [td.text.strip() for td in tr.find_elements(By.TAG_NAME, "td")]
            rows[int(cells[0].lstrip("#"))] = cells
        return rows

    def ledger():
        return {k: int(text("n-" + k)) for k in
                ("committed", "rejected", "failed", "killed", "running", "waiting")}

    def scrub(t):
        # What a drag of the range input does: a new value, then an "input" event.
        driver.execute_script(
            "const s = document.getElementById('scrub'); s.value = arguments[0];"
            "s.dispatchEvent(new Event('input', {bubbles: true}));", str(t))

    def assert_state_at(t):
        want = expected_at(t)
        rows = table()
        got = {i: cells[4] for i, cells in rows.items()}
        check(got == want, f"at {t} s the table shows every request's state ({counts(want)})")
        check(ledger() == counts(want), f"at {t} s the ledger reads {counts(want)}")
        check(text("now") == f"{t} s", f"the inspection time reads {t} s")

    # Loaded: nothing has happened yet.
    check(driver.title.startswith("drainit-gate"), "the page loads: " + driver.title)
    rows = table()
    check(len(rows) == len(run["requests"]), f"{len(rows)} request rows")
    check(all(c[4] == "waiting" for c in rows.values()), "every request is waiting at first")
    check(ledger()["committed"] == 0, "the ledger starts at 0 committed")
    verdict = text("verdict")
    check(verdict.startswith("GATE FAILS"), "the final verdict: " + verdict.splitlines()[0])
    check("15 committed, 4 rejected (allowance 0), 0 failed, 1 killed" in verdict,
          "the verdict carries the seed's ledger")
    check("#15" in verdict, "the verdict names the killed request")

    # Next event, three times: W1 starts, W2 starts, #1 is rejected at 1 s.
    nxt = find(By.ID, "next")
    for _ in range(3):
        nxt.click()
    rows = table()
    check(rows[1][4] == "rejected" and rows[1][2] == "–", "after three Next event: #1 rejected, no worker")
    check(rows[2][4] == "waiting", "#2 still waiting")
    check(ledger()["rejected"] == 1 and ledger()["committed"] == 0, "the ledger: 1 rejected")
    check(text("now") == "1 s", "the inspection time follows the event: 1 s")
    current = driver.find_elements(By.CSS_SELECTOR, "#requests tr.current")
    check(len(current) == 1 and current[0].get_attribute("data-id") == "1",
          "the current event's row is highlighted")
    cur_event = find(By.CSS_SELECTOR, "#events li.current").text
    check("#1 arrives: rejected 503" in cur_event, "the trace highlights: " + cur_event)

    # Next event: #2 is rejected at 3 s; then W1 becomes ready at 4 s.
    nxt.click()
    check(text("now") == "3 s" and table()[2][4] == "rejected" and ledger()["rejected"] == 2,
          "the next event: #2 rejected at 3 s, the ledger at 2 rejected")
    nxt.click()
    check(text("now") == "4 s" and "W1 is ready" in find(By.CSS_SELECTOR, "#events li.current").text,
          "the next event: W1 ready at 4 s")

    # The scrubber, to before the signal, the kill, and the end.
    for t in (12, 31, 35, 40):
        scrub(t)
        assert_state_at(t)
    rows = table()
    check(rows[15][2] == "W1" and rows[15][3] == "35 s" and rows[15][4] == "killed",
          "at 35 s #15 was killed on W1")
    check(find(By.CSS_SELECTOR, "#lane-W1 .mark.kill") is not None, "W1's lane shows the SIGKILL")
    scrub(31)
    check(table()[15][4] == "running", "back at 31 s #15 runs again")
    check(len(driver.find_elements(By.CSS_SELECTOR, "#lane-W1 .mark.kill")) == 0,
          "at 31 s W1's lane shows no SIGKILL yet")
    scrub(60)
    assert_state_at(60)
    final = ledger()
    check((final["committed"], final["rejected"], final["failed"], final["killed"])
          == (run["committed"], run["rejected"], run["failed"], run["killed"]),
          "at the end the ledger equals the run's")

    # Restart rewinds; Play moves the inspection time on by itself.
    find(By.ID, "restart").click()
    check(all(c[4] == "waiting" for c in table().values()) and text("now") == "0 s",
          "Restart rewinds to 0 s, every request waiting")
    driver.execute_script("const s = document.getElementById('speed'); s.value = '8';"
                          "s.dispatchEvent(new Event('change'));")
    find(By.ID, "play").click()
    deadline = time.time() + 10
    while time.time() < deadline and float(text("now").split()[0]) < 3:
        time.sleep(0.1)
    find(By.ID, "play").click()  # pause
    played = float(text("now").split()[0])
    check(played >= 3, f"Play advanced the inspection time to {played} s")
    time.sleep(0.5)
    check(float(text("now").split()[0]) == played, "Pause holds it")

    # The screenshot, at the kill, and it is not blank.
    scrub(35)
    driver.save_screenshot(SHOT)
finally:
    quit_browser()


def png_pixels(path):
    """Decodes an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) into
    rows of pixel tuples."""
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, "unexpected PNG format"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows


w, h, rows = png_pixels(SHOT)
hist = {}
for row in rows:
    for px in row:
        hist[px] = hist.get(px, 0) + 1
background, most = max(hist.items(), key=lambda kv: kv[1])
share = 1 - most / (w * h)
colored = sum(n for px, n in hist.items() if max(px) - min(px) > 60)
check(w >= 800 and h >= 600, f"the screenshot is {w}x{h}")
check(share > 0.05, f"{share:.1%} of the screenshot is not the background {background}")
check(len(hist) > 50, f"{len(hist)} distinct colours")
check(colored / (w * h) > 0.005, f"{colored / (w * h):.2%} of it is strongly coloured (bars, marks)")
print("page.py: all checks passed; screenshot", SHOT)
