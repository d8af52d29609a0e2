"""Shared by page.py and page_live.py: Debian's chromium, headless, through
chromium-driver (Selenium's Service is given /usr/bin/chromedriver, so Selenium
Manager downloads nothing), in a profile of its own that is removed at the end;
and the check that prints one line per assertion and exits 1 on the first
failure.
"""

import shutil
import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.service import Service


def check(ok, what):
    print(("ok:   " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        sys.exit(1)


def start():
    """A headless chromium (the browser's console log kept) and the function
    that quits it and removes its profile."""
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="drainit-gate-chromium-")
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
        "--window-size=1400,1300", "--user-data-dir=" + profile,
    ):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)

    def quit():
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)

    return driver, quit
