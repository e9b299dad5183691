"""The web console's own login (`console.login`, docs/operations.md) in a
real browser (headless chromium through chromedriver): a visitor logs in
with a user of the shared user table (made with confluent-kafka's SCRAM
admin API) and sees what the ACL table lets that user see; a wrong password
is refused, logging out ends the session. Screenshots are kept beside the
node's log."""
import os
import urllib.error
import urllib.request

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from realclients import metric
from rokka_fixture import Rokka, results_dir
from test_console import browser, url  # noqa: F401 - the browser fixture

PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret"}


@pytest.fixture(scope="module")
def rokka():
    r = Rokka(
        results_dir("cross", "test_console_login"),
        kafka_extra='sasl_listen = "127.0.0.1:0"\nsasl_max_failures_per_address = 1000\n',
        rocketmq_extra='[security]\nsuper_users = ["User:admin"]\n',
        console_extra="login = true\n",
    )
    r.start()
    try:
        # Users first, with authorization off; then it goes on.
        plain = AdminClient({"bootstrap.servers": r.bootstrap})
        ups = [UserScramCredentialUpsertion(u, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), p.encode())
               for u, p in PASSWORDS.items()]
        for f in plain.alter_user_scram_credentials(ups).values():
            f.result(15)
        for f in plain.create_topics([NewTopic("LoginPublic", 1), NewTopic("LoginSecret", 1)]).values():
            f.result(15)
        r.restart_with_authorization()
        admin = AdminClient({
            "bootstrap.servers": f"127.0.0.1:{r.sasl_port}",
            "security.protocol": "sasl_plaintext",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "admin",
            "sasl.password": PASSWORDS["admin"],
        })
        bindings = [
            AclBinding(ResourceType.TOPIC, "LoginPublic", ResourcePatternType.LITERAL, "User:alice", "*", op,
                       AclPermissionType.ALLOW)
            for op in (AclOperation.DESCRIBE, AclOperation.READ)
        ]
        for f in admin.create_acls(bindings).values():
            f.result(15)
        yield r
    finally:
        code = r.close()
        assert code == 0, f"rokka exited with {code}; log: {r.log_path}"


def log_in(browser, rokka, user, password):
    browser.get(url(rokka, "/login"))
    browser.find_element(By.ID, "user").send_keys(user)
    browser.find_element(By.ID, "password").send_keys(password)
    browser.find_element(By.ID, "login").click()


def topics_shown(browser):
    return {a.text for a in browser.find_elements(By.CSS_SELECTOR, "a[href^='/topic?name=']")}


def test_a_visitor_logs_in_and_sees_what_their_acls_allow(rokka, browser):
    wait = WebDriverWait(browser, 30)
    # No session: every page leads to the login form.
    browser.get(url(rokka, "/"))
    wait.until(EC.url_contains("/login"))
    assert browser.find_elements(By.ID, "password")
    # A wrong password is refused.
    log_in(browser, rokka, "alice", "not-her-password")
    wait.until(EC.presence_of_element_located((By.ID, "error")))
    assert "login failed" in browser.find_element(By.ID, "error").text
    assert "/login" in browser.current_url
    # alice sees the topic her ACLs let her describe, not the other.
    log_in(browser, rokka, "alice", PASSWORDS["alice"])
    wait.until(EC.presence_of_element_located((By.ID, "logout")))
    browser.save_screenshot(os.path.join(rokka.workdir, "console-login-alice.png"))
    assert browser.find_element(By.ID, "user").text == "alice"
    shown = topics_shown(browser)
    assert "LoginPublic" in shown and "LoginSecret" not in shown, shown
    # Logging out ends the session: the pages lead to the login form again.
    browser.find_element(By.ID, "logout").click()
    wait.until(EC.url_contains("/login"))
    browser.get(url(rokka, "/topic?name=LoginPublic"))
    wait.until(EC.url_contains("/login"))
    # admin (a super user) sees both.
    log_in(browser, rokka, "admin", PASSWORDS["admin"])
    wait.until(EC.presence_of_element_located((By.ID, "logout")))
    shown = topics_shown(browser)
    assert {"LoginPublic", "LoginSecret"} <= shown, shown
    browser.find_element(By.ID, "logout").click()
    wait.until(EC.url_contains("/login"))
    assert metric(rokka, "rokka_console_logins_total", result="failed") >= 1
    assert metric(rokka, "rokka_console_logins_total", result="ok") >= 2


def test_a_login_posted_from_elsewhere_is_refused(rokka):
    data = b"user=admin&password=admin-secret&token=forged"
    req = urllib.request.Request(url(rokka, "/login"), data=data, method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 403
    # Without a session cookie, a page is a redirect to the login form.
    with urllib.request.urlopen(url(rokka, "/group?name=x"), timeout=30) as r:
        assert r.url.endswith("/login") and "password" in r.read().decode()


def test_an_address_that_keeps_failing_is_held_off(rokka):
    """After `login_max_failures_per_address` (5) wrong passwords, logins
    from the address are refused (429) for the window, a right password
    too. Last in the file: this address stays held off for a minute."""
    import re

    with urllib.request.urlopen(url(rokka, "/login"), timeout=30) as r:
        token = re.search(r'name="token" value="([0-9a-f]+)"', r.read().decode()).group(1)

    def attempt(password):
        data = f"user=alice&password={password}&token={token}".encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url(rokka, "/login"), data=data), timeout=30) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    before = metric(rokka, "rokka_console_logins_total", result="failed")
    codes = []
    for _ in range(10):
        codes.append(attempt("wrong"))
        if codes[-1] == 429:
            break
    assert 401 in codes and codes[-1] == 429, codes
    assert metric(rokka, "rokka_console_logins_total", result="failed") - before <= 5
    assert attempt(PASSWORDS["alice"]) == 429, "held off: even the right password"
    assert metric(rokka, "rokka_console_logins_total", result="held_off") >= 2
    assert metric(rokka, "rokka_console_login_failing_addresses") >= 1
