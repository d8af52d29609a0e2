#!/usr/bin/env python3
"""A drill's or a fleet check's page in a real headless Chromium (as page.py, with
Debian's chromium + chromium-driver through Selenium). Run by gate/tests/page.rs:

    page_live.py PAGE.html RESULT.json

RESULT.json is the same run's `--json`. Asserts what a person sees: the page loads
without a script error, the verdict is the run's, and (for a drill) the table has
one row per planned request and, scrubbed to the end, shows each request's final
status and the ledger's counts. Prints one line per check; exits non-zero on the
first failure.
"""

import json
import pathlib
import sys

from selenium.webdriver.common.by import By

from browser import check, start

PAGE, RESULT = sys.argv[1], sys.argv[2]
res = json.loads(pathlib.Path(RESULT).read_text())


driver, quit_browser = start()
try:
    driver.get(pathlib.Path(PAGE).resolve().as_uri())
    text = lambda id_: driver.find_element(By.ID, id_).text.strip()
    errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    check(not errors, f"no script error ({errors})")
    verdict = text("verdict")
    want = "GATE PASSES" if res["pass"] else "GATE FAILS"
    check(verdict.startswith(want), "the verdict: " + verdict.splitlines()[0])
    if "requests" in res and isinstance(res["requests"], list):
        rows = driver.find_elements(By.CSS_SELECTOR, "#requests tbody tr")
        check(len(rows) == len(res["requests"]), f"{len(rows)} request rows")
        driver.execute_script(
            "const s = document.getElementById('scrub'); s.value = s.max;"
            "s.dispatchEvent(new Event('input', {bubbles: true}));")
        got = {}
        for tr in driver.find_elements(By.CSS_SELECTOR, "#requests tbody tr"):
            cells = [td.text.strip() for td in tr.find_elements(By.TAG_NAME, "td")]
            got[int(cells[0].lstrip("#"))] = cells[4]
        want_rows = {r["id"]: r["status"] for r in res["requests"]}
        check(got == want_rows, f"at the end every row shows its final status ({want_rows})")
        n = int(text("n-committed"))
        check(n == res["ledger"]["committed"], f"the ledger reads {n} committed")
    else:
        for r in res["replicas"]:
            check(r["name"] in verdict, f"the page names replica {r['name']}")
    print("all checks passed")
finally:
    quit_browser()
