"""The web console (docs/operations.md) in a real browser: Debian's
chromium, headless, driven through chromedriver by selenium. A group with one
Kafka and one RocketMQ member shows both with the lag of every queue; a dead
letter is shown and resent, and its group's consumer gets it once.
Screenshots are kept beside the node's log."""
import os
import shutil
import threading
import urllib.error
import urllib.request

import pytest
from kafka import KafkaConsumer
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from conftest import harness, rocketmq_consume
from rokka_fixture import running
from test_cross import RocketMQMember, create, kafka_produce, wait_for


@pytest.fixture(scope="module")
def rokka():
    with running("cross", "test_console", console_extra="", group_extra="initial_rebalance_delay_ms = 0\n") as r:
        yield r


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1600,1200"):
        opts.add_argument(a)
    b = webdriver.Chrome(service=Service(driver), options=opts)
    b.set_page_load_timeout(60)
    try:
        yield b
    finally:
        b.quit()


def url(rokka, path):
    return f"http://127.0.0.1:{rokka.console_port}{path}"


def rows(browser, table):
    """A table's rows as dicts (column → cell text)."""
    out = []
    for tr in browser.find_elements(By.CSS_SELECTOR, f"table#{table} tr"):
        cells = tr.find_elements(By.CSS_SELECTOR, "td[data-col]")
        if cells:
            out.append({c.get_attribute("data-col"): c.text for c in cells})
    return out


def shot(browser, rokka, name):
    browser.save_screenshot(os.path.join(rokka.workdir, f"console-{name}.png"))


def test_a_group_with_a_kafka_and_a_rocketmq_member_and_its_lag(rokka, browser):
    topic, group = "ConsoleMixed", "console-mixed"
    create(rokka, topic)
    kafka_produce(rokka, topic, [dict(value=f"c-{i}".encode(), partition=i % 4) for i in range(20)], compression=None)
    stop = threading.Event()
    # What the Kafka member last had, for the failure message.
    kafka_seen = {"polls": 0, "records": 0, "assignment": None}

    def kafka_member():
        k = KafkaConsumer(topic, bootstrap_servers=rokka.bootstrap, group_id=group, client_id="console-kafka",
                          auto_offset_reset="earliest", enable_auto_commit=True, auto_commit_interval_ms=300)
        while not stop.is_set():
            # Long enough for a join to complete inside one poll on a loaded
            # machine (kafka-python runs its group protocol within poll).
            got = k.poll(timeout_ms=1000)
            kafka_seen["polls"] += 1
            kafka_seen["records"] += sum(len(v) for v in got.values())
            kafka_seen["assignment"] = sorted(tp.partition for tp in k.assignment())
        k.close()

    # The RocketMQ member outlives the wait below (40 s): both members must
    # be in the group for it to settle.
    rmq = RocketMQMember(rokka, "console-member", topic, group, 45)
    t = threading.Thread(target=kafka_member)
    t.start()
    try:
        # From the overview, by its link, as an operator would.
        browser.get(url(rokka, "/"))
        assert topic in [r["topic"] for r in rows(browser, "topics")]
        seen = [None]

        def settled():
            browser.get(url(rokka, "/"))
            links = browser.find_elements(By.LINK_TEXT, group)
            if not links:
                return False
            links[0].click()
            WebDriverWait(browser, 30).until(EC.url_contains("/group?name="))
            members = rows(browser, "members")
            # (A RocketMQ member also holds offsets of its %RETRY% topic.)
            offsets = [o for o in rows(browser, "offsets") if o["topic"] == topic]
            seen[0] = (members, offsets)
            return (
                sorted(m["protocol"] for m in members) == ["kafka", "rocketmq"]
                and len(offsets) == 4
                and all(o["end"] == "5" and o["lag"] == "0" for o in offsets)
                and {o["owner"] for o in offsets} == {m["client_id"] for m in members}
            )

        wait_for(
            settled,
            lambda: f"both members and lag 0 on every queue; last {seen[0]}; the Kafka member: {kafka_seen}",
            timeout=40,
        )
        shot(browser, rokka, "group")
        members, offsets = seen[0]
        assert "console-kafka" in {m["client_id"] for m in members}
    finally:
        stop.set()
        t.join(30)
        rmq.finish(60)
    # Five more arrive with nobody consuming: the lag shows them per queue.
    kafka_produce(rokka, topic, [dict(value=f"d-{i}".encode(), partition=i % 4) for i in range(8)], compression=None)
    browser.get(url(rokka, f"/group?name={group}"))
    assert [o["lag"] for o in rows(browser, "offsets") if o["topic"] == topic] == ["2"] * 4
    # The message browser shows a queue's messages.
    browser.get(url(rokka, f"/messages?topic={topic}&queue=1&offset=0"))
    assert [m["body"] for m in rows(browser, "messages")] == [f"c-{i}" for i in range(1, 20, 4)] + ["d-1", "d-5"]
    shot(browser, rokka, "messages")


def test_a_dead_letter_is_shown_and_resent(rokka, browser):
    harness(rokka, "retry-dlq")
    group = "compat-cg-retry"
    browser.get(url(rokka, f"/dlq?group={group}"))
    listed = rows(browser, "messages")
    assert len(listed) == 5 and {m["original_topic"] for m in listed} == {"CompatRetry"}, listed
    shot(browser, rokka, "dlq")
    first = listed[0]
    browser.get(url(rokka, f"/messages?id={first['msg_id']}&topic=%25DLQ%25{group}"))
    body = rows(browser, "messages")[0]["body"]
    browser.get(url(rokka, f"/dlq?group={group}"))
    browser.find_elements(By.CSS_SELECTOR, "table#messages input[type=checkbox]")[0].click()
    browser.find_element(By.ID, "resend").click()
    # The click returns once the form is submitted, not once the resend's page
    # has come back: wait for that page (its summary), showing it if it never does.
    try:
        WebDriverWait(browser, 30).until(EC.presence_of_element_located((By.ID, "summary")))
    except TimeoutException:
        shot(browser, rokka, "resend-timeout")
        raise AssertionError(f"no resend result page: {browser.current_url}\n{browser.page_source[:4000]}")
    results = rows(browser, "results")
    assert [(r["offset"], r["result"]) for r in results] == [(first["offset"], "resent")], results
    assert browser.find_element(By.ID, "summary").text == "1 resent, 0 failed"
    shot(browser, rokka, "resent")
    # The group's consumer (past the originals) gets it, once.
    got = rocketmq_consume(rokka, "CompatRetry", group, 1)
    assert [d.body for d in got] == [body.encode()]
    # A form from elsewhere (no token) is refused.
    req = urllib.request.Request(url(rokka, "/dlq/resend"), data=f"group={group}&pick=x".encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 403


def test_a_page_of_another_name_is_refused(rokka):
    """DNS rebinding: a site whose name was pointed at the console's address
    would read its pages as its own. The console answers to IP addresses,
    localhost and console.allowed_hosts only (421 otherwise, counted)."""
    import http.client

    def get(host):
        c = http.client.HTTPConnection("127.0.0.1", rokka.console_port, timeout=30)
        c.putrequest("GET", "/", skip_host=True)
        c.putheader("Host", host)
        c.endheaders()
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body

    assert get(f"attacker.example:{rokka.console_port}")[0] == 421
    for host in (f"127.0.0.1:{rokka.console_port}", f"localhost:{rokka.console_port}"):
        status, body = get(host)
        assert status == 200 and b"<nav" in body, (host, status)
    got = {k: v for k, v in rokka.metric_values().items() if "wrong_host" in k}
    assert sum(got.values()) >= 1, got
