//! The web console (`[console]`): server-rendered pages over the same admin
//! calls as the CLI (`rokka topic|group|message|dlq`), made to this node's
//! own Kafka listener and name server, so what it shows is what clients
//! see, under the same ACLs (as `console.user` when set). No script, no
//! assets: one HTML page per view.
//!
//! Pages: `/` (cluster, topics with rates, groups), `/topic?name=`,
//! `/group?name=` (members of both protocols, lag per queue), `/messages`
//! (browser: by queue offset, key, id or time), `/dlq?group=` (dead
//! letters, resend with a result per message).

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, Report};
use crate::endpoint::ConnBudget;

/// A form post larger than this is refused.
const MAX_FORM_BYTES: usize = 256 * 1024;

pub struct Console {
    /// This node's Kafka listener (its SASL one with `console.user`).
    kafka: String,
    /// The name server this node registers with.
    namesrv: String,
    credentials: Option<admin::Credentials>,
    /// Per topic: when its end offsets were last summed, and the sum.
    samples: Mutex<HashMap<String, (Instant, i64)>>,
    /// Forms carry it: a page elsewhere cannot post to the console.
    token: String,
    /// `console.login`: who is logged in.
    login: Option<Login>,
    /// `console.allowed_hosts`, lowercased.
    allowed_hosts: Vec<String>,
}

/// A page being served: the console, and whom its admin calls log in as
/// (the visitor's session with `console.login`, else `console.user`).
pub struct Ctx {
    console: Arc<Console>,
    credentials: Option<admin::Credentials>,
}

impl std::ops::Deref for Ctx {
    type Target = Console;
    fn deref(&self) -> &Console {
        &self.console
    }
}

/// `console.login`: sessions by the random token their cookie carries.
pub struct Login {
    sessions: Mutex<HashMap<String, Session>>,
    timeout: Duration,
    max: usize,
    /// Whose users a login is checked against (the one user table).
    broker: Arc<rokka_broker::Broker>,
    /// Failed logins per address: held off past the budget.
    failures: rokka_broker::limits::AuthFailures,
}

struct Session {
    credentials: admin::Credentials,
    last_seen: Instant,
    /// The user's credentials when the session began
    /// ([`rokka_broker::users::Users::fingerprint`]): a change ends it.
    fingerprint: Option<Vec<u8>>,
}

const COOKIE: &str = "rokka_session";

impl Login {
    pub fn new(cfg: &crate::config::ConsoleConfig, broker: Arc<rokka_broker::Broker>) -> Login {
        Login {
            sessions: Mutex::new(HashMap::new()),
            timeout: Duration::from_millis(cfg.session_timeout_ms),
            max: cfg.max_sessions as usize,
            broker,
            failures: rokka_broker::limits::AuthFailures::new(
                "rokka_console_login_failing_addresses",
                cfg.login_max_failures_per_address,
                Duration::from_millis(cfg.login_failure_window_ms),
            ),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The session's credentials, its idle time restarted; None when it
    /// is unknown or ran out.
    fn visit(&self, token: &str) -> Option<admin::Credentials> {
        let mut s = self.lock();
        let live = s.get(token).is_some_and(|x| x.last_seen.elapsed() < self.timeout);
        if !live {
            if s.remove(token).is_some() {
                metrics::gauge!("rokka_console_sessions").set(s.len() as f64);
            }
            return None;
        }
        let x = s.get_mut(token)?;
        // The user's password changed or the user went: the session ends
        // (its pages sign in with the password it began with, and each
        // failure counted toward the SASL hold-off of the console's own
        // address, which then locked every console user out).
        if self.broker.users().fingerprint(&x.credentials.user) != x.fingerprint {
            s.remove(token);
            metrics::gauge!("rokka_console_sessions").set(s.len() as f64);
            return None;
        }
        x.last_seen = Instant::now();
        Some(x.credentials.clone())
    }

    /// A new session's token; None when `max_sessions` live ones are held
    /// (or no secure random token can be made). A user holds at most
    /// [`SESSIONS_PER_USER`]: logging in again past it ends that user's
    /// least recently used session, so one user's logins cannot fill the
    /// table and lock every other user out.
    /// `fingerprint`: the user's credentials as read before its password
    /// was checked (read after, a change between would pair the old
    /// password with the new credentials and the session live on).
    fn open(&self, credentials: admin::Credentials, fingerprint: Option<Vec<u8>>) -> Option<String> {
        let mut s = self.lock();
        let timeout = self.timeout;
        s.retain(|_, x| x.last_seen.elapsed() < timeout);
        let mine = || s.iter().filter(|(_, x)| x.credentials.user == credentials.user);
        if mine().count() >= SESSIONS_PER_USER {
            if let Some(oldest) = mine().min_by_key(|(_, x)| x.last_seen).map(|(t, _)| t.clone()) {
                s.remove(&oldest);
            }
        }
        if s.len() >= self.max {
            return None;
        }
        let token = random_hex(32)?;
        s.insert(
            token.clone(),
            Session {
                credentials,
                last_seen: Instant::now(),
                fingerprint,
            },
        );
        metrics::gauge!("rokka_console_sessions").set(s.len() as f64);
        Some(token)
    }

    fn close(&self, token: &str) {
        let mut s = self.lock();
        s.remove(token);
        metrics::gauge!("rokka_console_sessions").set(s.len() as f64);
    }
}

/// Sessions one user holds at most (a person's browsers and tabs).
const SESSIONS_PER_USER: usize = 32;

/// `n` random bytes as hex; None if the system's secure random source
/// fails (a session or form token of zeros would be guessable).
fn random_hex(n: usize) -> Option<String> {
    let mut raw = vec![0u8; n];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).ok()?;
    Some(raw.iter().map(|b| format!("{b:02x}")).collect())
}

impl Console {
    pub fn new(
        kafka: String,
        namesrv: String,
        credentials: Option<admin::Credentials>,
        login: Option<Login>,
        allowed_hosts: Vec<String>,
    ) -> Console {
        Console {
            kafka,
            namesrv,
            credentials,
            samples: Mutex::new(HashMap::new()),
            // (Should the secure source fail: std's per-process random
            // hash keys, which come from the OS as well.)
            token: random_hex(16).unwrap_or_else(|| {
                use std::hash::BuildHasher;
                let r = std::collections::hash_map::RandomState::new();
                format!("{:016x}{:016x}", r.hash_one(1u8), r.hash_one(2u8))
            }),
            login,
            allowed_hosts: allowed_hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
        }
    }

    /// Whether a request's Host header names this console: an IP address,
    /// `localhost`, or one of `console.allowed_hosts` (any port). A name
    /// that is none of these is another site's pointed at this address
    /// (DNS rebinding): its pages would read the console as their own.
    fn answers_to(&self, host: &str) -> bool {
        let name = match host.strip_prefix('[') {
            // [v6]:port
            Some(rest) => {
                return rest
                    .split_once(']')
                    .is_some_and(|(a, _)| a.parse::<std::net::Ipv6Addr>().is_ok())
            }
            None => host.rsplit_once(':').map_or(host, |(h, _)| h),
        };
        let name = name.to_ascii_lowercase();
        name.parse::<std::net::Ipv4Addr>().is_ok() || name == "localhost" || self.allowed_hosts.contains(&name)
    }
}

/// Serves pages until `shutdown`, each connection within `budget`
/// (`console.max_connections`, `console.connection_timeout_ms`: one deadline
/// for a connection's pages, their admin calls included).
pub async fn serve(
    listener: TcpListener,
    console: Arc<Console>,
    budget: Arc<ConnBudget>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut accept_errors = rokka_broker::limits::AcceptErrors::new("console");
    loop {
        let slot = tokio::select! {
            s = budget.acquire() => s,
            _ = shutdown.changed() => return,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    accept_errors.accepted();
                    a
                }
                Err(e) => {
                    accept_errors.failed(&e);
                    tokio::time::sleep(rokka_broker::limits::AcceptErrors::PAUSE).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let c = Arc::clone(&console);
        let budget = Arc::clone(&budget);
        tokio::spawn(async move {
            let (conn, deadline) = budget.accepted(slot);
            let service = hyper::service::service_fn(move |req| answer(req, Arc::clone(&c), peer.ip()));
            budget.serve_http(conn, deadline, TokioIo::new(stream), service).await;
        });
    }
}

/// `a=1&b=x%20y` → pairs (a key may repeat).
fn form(query: &str) -> Vec<(String, String)> {
    fn unescape(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => {
                    match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                        Ok(v) => {
                            out.push(v);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (unescape(k), unescape(v))
        })
        .collect()
}

fn param<'a>(f: &'a [(String, String)], key: &str) -> Option<&'a str> {
    f.iter()
        .find(|(k, v)| k == key && !v.trim().is_empty())
        .map(|(_, v)| v.trim())
}

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a query value.
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t} · Rokka</title><style>\
         body{{font-family:system-ui,sans-serif;margin:1.5em;color:#222}}\
         nav a{{margin-right:1em}}table{{border-collapse:collapse;margin:.5em 0 1.5em}}\
         th,td{{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top;font-size:.9em}}\
         th{{background:#f3f3f3}}td.body{{font-family:monospace;white-space:pre-wrap;max-width:40em;word-break:break-all}}\
         .error{{color:#a00;font-weight:bold}}.ok{{color:#070}}.failed{{color:#a00;font-weight:bold}}\
         form.inline input{{margin-right:.5em}}</style></head><body>\
         <nav><b>Rokka</b> &nbsp; <a href=\"/\">Overview</a><a href=\"/messages\">Messages</a></nav>\
         <h1>{t}</h1>{body}</body></html>",
        t = esc(title)
    )
}

/// One cell: links for the columns that name a topic or a group.
fn cell(column: &str, v: &Value) -> String {
    let text = admin::cell(v);
    match (column, v) {
        ("topic" | "original_topic", Value::String(t)) => format!("<a href=\"/topic?name={}\">{}</a>", enc(t), esc(t)),
        ("group", Value::String(g)) => format!("<a href=\"/group?name={}\">{}</a>", enc(g), esc(g)),
        ("body", _) => format!("<span class=\"body\">{}</span>", esc(&text)),
        ("result", Value::String(r)) => format!("<span class=\"{}\">{}</span>", esc(r), esc(r)),
        _ => esc(&text),
    }
}

/// A first column for one section's rows: (section, cell of a row).
type RowPicker<'a> = (&'a str, &'a dyn Fn(&[Value]) -> String);

fn tables(report: &Report, extra: Option<RowPicker<'_>>) -> String {
    let mut out = String::new();
    for sec in &report.sections {
        let _ = write!(out, "<h2>{}</h2><table id=\"{}\"><tr>", esc(sec.name), esc(sec.name));
        let extra = extra.filter(|(name, _)| *name == sec.name);
        if extra.is_some() {
            out.push_str("<th></th>");
        }
        for c in &sec.columns {
            let _ = write!(out, "<th>{}</th>", esc(c));
        }
        out.push_str("</tr>");
        for row in &sec.rows {
            out.push_str("<tr>");
            if let Some((_, f)) = extra {
                let _ = write!(out, "<td>{}</td>", f(row));
            }
            for (c, v) in sec.columns.iter().zip(row) {
                let class = if *c == "body" { " class=\"body\"" } else { "" };
                let _ = write!(out, "<td data-col=\"{}\"{class}>{}</td>", esc(c), cell(c, v));
            }
            out.push_str("</tr>");
        }
        if sec.rows.is_empty() {
            let _ = write!(
                out,
                "<tr><td colspan=\"{}\"><i>none</i></td></tr>",
                sec.columns.len() + 1
            );
        }
        out.push_str("</table>");
    }
    if let Some(m) = &report.message {
        let _ = write!(out, "<p id=\"message\">{}</p>", esc(m));
    }
    out
}

fn error(e: &admin::AdminError) -> String {
    format!("<p class=\"error\" id=\"error\">{}</p>", esc(&e.to_string()))
}

async fn answer(
    req: Request<Incoming>,
    c: Arc<Console>,
    peer: std::net::IpAddr,
) -> Result<Response<Full<Bytes>>, Infallible> {
    // No Host (HTTP/1.0 tools) is no browser's page.
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}"));
    if host.is_some_and(|h| !c.answers_to(h)) {
        metrics::counter!("rokka_console_requests_total", "page" => "any", "result" => "wrong_host").increment(1);
        return Ok(plain(
            StatusCode::MISDIRECTED_REQUEST,
            "this console answers to its IP address, localhost and console.allowed_hosts only\n",
        ));
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = form(req.uri().query().unwrap_or(""));
    let same_origin = match (
        req.headers().get(hyper::header::ORIGIN),
        req.headers().get(hyper::header::HOST),
    ) {
        (None, _) => true,
        (Some(o), Some(h)) => {
            o.to_str()
                .ok()
                .map(|o| o.trim_start_matches("http://").trim_start_matches("https://"))
                == h.to_str().ok()
        }
        (Some(_), None) => false,
    };
    let cookie = req
        .headers()
        .get_all(hyper::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string());
    let posted = if method == Method::POST {
        match Limited::new(req.into_body(), MAX_FORM_BYTES).collect().await {
            Ok(b) => Some(form(&String::from_utf8_lossy(&b.to_bytes()))),
            Err(_) => return Ok(plain(StatusCode::PAYLOAD_TOO_LARGE, "form too large\n")),
        }
    } else {
        None
    };
    let credentials = match &c.login {
        None => c.credentials.clone(),
        Some(login) => {
            let session = cookie.as_deref().and_then(|t| login.visit(t));
            match (session, &method, path.as_str()) {
                (Some(creds), _, _) if path != "/login" => Some(creds),
                (_, &Method::POST, "/login") => {
                    let f = posted.unwrap_or_default();
                    if !same_origin || param(&f, "token") != Some(c.token.as_str()) {
                        return Ok(html_response(
                            StatusCode::FORBIDDEN,
                            page("Log in", "<p class=\"error\">refused: not a form of this console</p>"),
                            None,
                        ));
                    }
                    let creds = admin::Credentials {
                        user: param(&f, "user").unwrap_or_default().to_string(),
                        password: f
                            .iter()
                            .find(|(k, _)| k == "password")
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default(),
                    };
                    return Ok(log_in(c, creds, peer).await);
                }
                (_, &Method::GET, "/login") => {
                    return Ok(html_response(StatusCode::OK, login_page(&c, None), None));
                }
                _ => return Ok(redirect("/login", None)),
            }
        }
    };
    if let (Some(login), &Method::POST, "/logout") = (&c.login, &method, path.as_str()) {
        if !same_origin || posted.as_deref().and_then(|f| param(f, "token")) != Some(c.token.as_str()) {
            return Ok(html_response(
                StatusCode::FORBIDDEN,
                page("Log out", "<p class=\"error\">refused: not a form of this console</p>"),
                None,
            ));
        }
        if let Some(t) = cookie.as_deref() {
            login.close(t);
        }
        let expired = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
        return Ok(redirect("/login", Some(expired)));
    }
    let who = c.login.as_ref().and(credentials.as_ref()).map(|cr| cr.user.clone());
    let token = c.token.clone();
    let c = Ctx {
        console: c,
        credentials,
    };
    let (status, html) = match (&method, path.as_str(), posted) {
        (&Method::GET, "/", _) => (StatusCode::OK, render(c, overview).await),
        (&Method::GET, "/topic", _) => match param(&query, "name").map(str::to_string) {
            Some(t) => (StatusCode::OK, render(c, move |c| topic_page(c, &t)).await),
            None => (
                StatusCode::BAD_REQUEST,
                page("Topic", "<p class=\"error\">name a topic</p>"),
            ),
        },
        (&Method::GET, "/group", _) => match param(&query, "name").map(str::to_string) {
            Some(g) => (StatusCode::OK, render(c, move |c| group_page(c, &g)).await),
            None => (
                StatusCode::BAD_REQUEST,
                page("Group", "<p class=\"error\">name a group</p>"),
            ),
        },
        (&Method::GET, "/messages", _) => (StatusCode::OK, render(c, move |c| messages_page(c, &query)).await),
        (&Method::GET, "/dlq", _) => match param(&query, "group").map(str::to_string) {
            Some(g) => (StatusCode::OK, render(c, move |c| dlq_page(c, &g)).await),
            None => (
                StatusCode::BAD_REQUEST,
                page("Dead letters", "<p class=\"error\">name a group</p>"),
            ),
        },
        (&Method::POST, "/dlq/resend", Some(f)) => {
            if !same_origin || param(&f, "token") != Some(c.token.as_str()) {
                metrics::counter!("rokka_console_requests_total", "page" => "resend", "result" => "forbidden")
                    .increment(1);
                (
                    StatusCode::FORBIDDEN,
                    page("Resend", "<p class=\"error\">refused: not a form of this console</p>"),
                )
            } else {
                (StatusCode::OK, render(c, move |c| resend_page(c, &f)).await)
            }
        }
        (&Method::GET, _, _) => (StatusCode::NOT_FOUND, page("Not found", "<p>No such page.</p>")),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            page("Not allowed", "<p>GET, and POST for forms.</p>"),
        ),
    };
    let html = match who {
        // Who is logged in, and the way out, on every page.
        Some(user) => html.replacen(
            "</nav>",
            &format!(
                "<form method=\"post\" action=\"/logout\" class=\"inline\" style=\"display:inline;float:right\">\
                 <span id=\"user\">{}</span> <input type=\"hidden\" name=\"token\" value=\"{}\">\
                 <button type=\"submit\" id=\"logout\">Log out</button></form></nav>",
                esc(&user),
                token
            ),
            1,
        ),
        None => html,
    };
    Ok(html_response(status, html, None))
}

fn html_response(status: StatusCode, html: String, set_cookie: Option<String>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(html)));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Not framed by other sites.
    h.insert(
        hyper::header::HeaderName::from_static("x-frame-options"),
        hyper::header::HeaderValue::from_static("DENY"),
    );
    if let Some(v) = set_cookie.and_then(|v| hyper::header::HeaderValue::from_str(&v).ok()) {
        h.insert(hyper::header::SET_COOKIE, v);
    }
    resp
}

fn redirect(to: &'static str, set_cookie: Option<String>) -> Response<Full<Bytes>> {
    let mut r = html_response(StatusCode::SEE_OTHER, String::new(), set_cookie);
    r.headers_mut()
        .insert(hyper::header::LOCATION, hyper::header::HeaderValue::from_static(to));
    r
}

fn login_page(c: &Console, failed: Option<&str>) -> String {
    let error = failed
        .map(|why| format!("<p class=\"error\" id=\"error\">{}</p>", esc(why)))
        .unwrap_or_default();
    page(
        "Log in",
        &format!(
            "{error}<form method=\"post\" action=\"/login\">\
             <p><label>User <input name=\"user\" id=\"user\" autocomplete=\"username\"></label></p>\
             <p><label>Password <input name=\"password\" id=\"password\" type=\"password\" \
             autocomplete=\"current-password\"></label></p>\
             <input type=\"hidden\" name=\"token\" value=\"{}\">\
             <p><button type=\"submit\" id=\"login\">Log in</button></p></form>",
            c.token
        ),
    )
}

/// Checks the credentials against the one user table (as the SASL
/// listeners check a PLAIN login) and opens a session for them; an address
/// that failed `login_max_failures_per_address` times is held off for the
/// rest of `login_failure_window_ms`.
async fn log_in(c: Arc<Console>, creds: admin::Credentials, peer: std::net::IpAddr) -> Response<Full<Bytes>> {
    let Some(login) = c.login.as_ref() else {
        return redirect("/", None);
    };
    if login.failures.blocked(peer) {
        metrics::counter!("rokka_console_logins_total", "result" => "held_off").increment(1);
        return html_response(
            StatusCode::TOO_MANY_REQUESTS,
            login_page(&c, Some("too many failed logins from this address: try again later")),
            None,
        );
    }
    let broker = Arc::clone(&login.broker);
    let tried = creds.clone();
    // Salted-password checks are CPU work: off the async workers.
    let checked = tokio::task::spawn_blocking(move || {
        let fingerprint = broker.users().fingerprint(&tried.user);
        let ok = !tried.user.is_empty() && broker.users().check_password(&tried.user, tried.password.as_bytes());
        ok.then_some(fingerprint)
    })
    .await
    .ok()
    .flatten();
    let Some(fingerprint) = checked else {
        login.failures.failed(peer);
        metrics::counter!("rokka_console_logins_total", "result" => "failed").increment(1);
        tracing::info!(user = creds.user, %peer, "console: login failed");
        return html_response(
            StatusCode::UNAUTHORIZED,
            login_page(&c, Some("login failed: unknown user or wrong password")),
            None,
        );
    };
    let user = creds.user.clone();
    match login.open(creds, fingerprint) {
        Some(token) => {
            metrics::counter!("rokka_console_logins_total", "result" => "ok").increment(1);
            tracing::info!(user, "console: logged in");
            redirect(
                "/",
                Some(format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/")),
            )
        }
        None => {
            metrics::counter!("rokka_console_logins_total", "result" => "full").increment(1);
            html_response(
                StatusCode::SERVICE_UNAVAILABLE,
                login_page(&c, Some("too many sessions (console.max_sessions): try again later")),
                None,
            )
        }
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r
}

/// Most bytes of a message body a console page shows.
const CONSOLE_BODY_BYTES: usize = 4096;

/// Runs a page's blocking admin calls off the async workers.
async fn render<F>(c: Ctx, f: F) -> String
where
    F: FnOnce(&Ctx) -> String + Send + 'static,
{
    let started = Instant::now();
    // Bodies shown by their first CONSOLE_BODY_BYTES: the console runs in
    // the broker, and a client's compressed bodies inflate to 64 MiB each.
    let out = tokio::task::spawn_blocking(move || {
        let _preview = admin::preview_bodies(CONSOLE_BODY_BYTES);
        f(&c)
    })
    .await;
    metrics::histogram!("rokka_console_page_seconds").record(started.elapsed().as_secs_f64());
    match out {
        Ok(html) => {
            metrics::counter!("rokka_console_requests_total", "page" => "view", "result" => "ok").increment(1);
            html
        }
        Err(e) => {
            metrics::counter!("rokka_console_requests_total", "page" => "view", "result" => "error").increment(1);
            page("Error", &format!("<p class=\"error\">{}</p>", esc(&e.to_string())))
        }
    }
}

fn overview(c: &Ctx) -> String {
    let mut k = admin::KafkaClient::new(&c.kafka, c.credentials.clone());
    let mut body = String::new();
    match admin::cluster_report(&mut k) {
        Ok(r) => body.push_str(&tables(&r, None)),
        Err(e) => body.push_str(&error(&e)),
    }
    match admin::topic_rates(&mut k, &c.samples) {
        Ok(r) => body.push_str(&tables(&r, None)),
        Err(e) => body.push_str(&error(&e)),
    }
    match admin::group_list(&mut k) {
        Ok(r) => body.push_str(&tables(&r, None)),
        Err(e) => body.push_str(&error(&e)),
    }
    page("Overview", &body)
}

fn topic_page(c: &Ctx, topic: &str) -> String {
    let mut k = admin::KafkaClient::new(&c.kafka, c.credentials.clone());
    let mut body = format!(
        "<p><a href=\"/messages?topic={t}&queue=0&offset=0\">Browse messages</a></p>",
        t = enc(topic)
    );
    match admin::topic_describe(&mut k, topic) {
        Ok(r) => body.push_str(&tables(&r, None)),
        Err(e) => body.push_str(&error(&e)),
    }
    match admin::topic_config(&mut k, topic, &[], &[]) {
        Ok(r) => body.push_str(&tables(&r, None)),
        Err(e) => body.push_str(&error(&e)),
    }
    page(&format!("Topic {topic}"), &body)
}

fn group_page(c: &Ctx, group: &str) -> String {
    let mut k = admin::KafkaClient::new(&c.kafka, c.credentials.clone());
    let mut body = format!("<p><a href=\"/dlq?group={}\">Dead letters</a></p>", enc(group));
    match admin::group_describe(&mut k, group) {
        Ok(r) => body.push_str(&tables(&r, None)),
        Err(e) => body.push_str(&error(&e)),
    }
    page(&format!("Group {group}"), &body)
}

fn messages_page(c: &Ctx, q: &[(String, String)]) -> String {
    let v = |k: &str| esc(param(q, k).unwrap_or(""));
    let mut body = format!(
        "<form method=\"get\" action=\"/messages\" class=\"inline\">\
         topic <input name=\"topic\" value=\"{}\"> queue <input name=\"queue\" size=\"3\" value=\"{}\"> \
         offset <input name=\"offset\" size=\"8\" value=\"{}\"> or key <input name=\"key\" value=\"{}\"> \
         or id <input name=\"id\" size=\"34\" value=\"{}\"> or from (ms) <input name=\"from\" size=\"14\" value=\"{}\"> \
         to <input name=\"to\" size=\"14\" value=\"{}\"> count <input name=\"count\" size=\"4\" value=\"{}\"> \
         broker <input name=\"broker\" size=\"10\" value=\"{}\"> <button type=\"submit\">Find</button></form>",
        v("topic"),
        v("queue"),
        v("offset"),
        v("key"),
        v("id"),
        v("from"),
        v("to"),
        v("count"),
        v("broker"),
    );
    let num = |k: &str| param(q, k).and_then(|s| s.parse::<i64>().ok());
    let asked = ["offset", "key", "id", "from"].iter().any(|k| param(q, k).is_some());
    if asked {
        let mut r = admin::RemotingClient::new(&c.namesrv, c.credentials.clone());
        let got = admin::message_get(
            &mut r,
            param(q, "topic"),
            num("queue").unwrap_or(0).max(0) as u32,
            num("offset"),
            param(q, "id"),
            param(q, "key"),
            num("from"),
            num("to"),
            num("count").map(|n| n.clamp(1, 1000) as u32).or(Some(20)),
            param(q, "broker"),
        );
        match got {
            Ok(r) => body.push_str(&tables(&r, None)),
            Err(e) => body.push_str(&error(&e)),
        }
    }
    page("Messages", &body)
}

fn dlq_page(c: &Ctx, group: &str) -> String {
    let mut r = admin::RemotingClient::new(&c.namesrv, c.credentials.clone());
    let mut body = String::new();
    match admin::dlq_list(&mut r, group, 500) {
        Ok((report, _)) => {
            let _ = write!(
                body,
                "<form method=\"post\" action=\"/dlq/resend\"><input type=\"hidden\" name=\"token\" value=\"{}\">\
                 <input type=\"hidden\" name=\"group\" value=\"{}\">",
                esc(&c.token),
                esc(group)
            );
            let pick = |row: &[Value]| {
                // broker | queue | offset, as the messages section lists them.
                let id = format!(
                    "{}|{}|{}",
                    admin::cell(&row[0]),
                    admin::cell(&row[1]),
                    admin::cell(&row[2])
                );
                format!("<input type=\"checkbox\" name=\"pick\" value=\"{}\">", esc(&id))
            };
            body.push_str(&tables(&report, Some(("messages", &pick))));
            body.push_str("<button type=\"submit\" id=\"resend\">Resend the chosen to their topic</button></form>");
        }
        Err(e) => body.push_str(&error(&e)),
    }
    page(&format!("Dead letters of {group}"), &body)
}

fn resend_page(c: &Ctx, f: &[(String, String)]) -> String {
    let Some(group) = param(f, "group") else {
        return page("Resend", "<p class=\"error\">no group</p>");
    };
    // Per (broker, queue): the offsets chosen.
    let mut chosen: Vec<((String, u32), Vec<i64>)> = Vec::new();
    for (k, v) in f {
        if k != "pick" {
            continue;
        }
        let mut parts = v.splitn(3, '|');
        let (Some(b), Some(q), Some(o)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(q), Ok(o)) = (q.parse::<u32>(), o.parse::<i64>()) else {
            continue;
        };
        match chosen.iter_mut().find(|(key, _)| key.0 == b && key.1 == q) {
            Some((_, offs)) => offs.push(o),
            None => chosen.push(((b.to_string(), q), vec![o])),
        }
    }
    let mut body = format!(
        "<p><a href=\"/dlq?group={}\">Back to the dead letters</a></p>",
        enc(group)
    );
    if chosen.is_empty() {
        body.push_str("<p class=\"error\" id=\"error\">nothing chosen</p>");
        return page("Resend", &body);
    }
    let mut r = admin::RemotingClient::new(&c.namesrv, c.credentials.clone());
    let (mut sent, mut failed) = (0, 0);
    for ((broker, queue), offsets) in chosen {
        match admin::dlq_resend(&mut r, group, &offsets, false, queue, Some(&broker)) {
            Ok((report, _)) => {
                let mut resent_here = 0;
                for sec in &report.sections {
                    for row in &sec.rows {
                        match row.get(5).and_then(Value::as_str) {
                            Some("resent") => resent_here += 1,
                            _ => failed += 1,
                        }
                    }
                }
                sent += resent_here;
                metrics::counter!("rokka_console_resends_total", "result" => "resent").increment(resent_here as u64);
                body.push_str(&tables(&report, None));
            }
            Err(e) => {
                failed += offsets.len();
                body.push_str(&error(&e));
            }
        }
    }
    if failed > 0 {
        metrics::counter!("rokka_console_resends_total", "result" => "failed").increment(failed as u64);
    }
    let _ = write!(body, "<p id=\"summary\">{sent} resent, {failed} failed</p>");
    page(&format!("Resend dead letters of {group}"), &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_and_pages_escape() {
        let f = form("topic=a%20b&pick=x%7C0%7C3&pick=y+z&bad=%zz&end=%4");
        assert_eq!(param(&f, "topic"), Some("a b"));
        let picks: Vec<&str> = f.iter().filter(|(k, _)| k == "pick").map(|(_, v)| v.as_str()).collect();
        assert_eq!(picks, ["x|0|3", "y z"]);
        assert_eq!(param(&f, "bad"), Some("%zz"));
        assert_eq!(param(&f, "end"), Some("%4"));
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
        assert_eq!(enc("%DLQ%g 1"), "%25DLQ%25g%201");
        assert!(cell("topic", &Value::String("<t>".into())).contains("&lt;t&gt;"));
    }

    #[test]
    fn one_users_logins_cannot_fill_the_session_table() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path(),
        ))?);
        let broker = Arc::new(rokka_broker::Broker::new(store, rokka_broker::BrokerConfig::default())?);
        let cfg = crate::config::ConsoleConfig {
            max_sessions: 40,
            ..Default::default()
        };
        let login = Login::new(&cfg, broker);
        let who = |u: &str| admin::Credentials {
            user: u.into(),
            password: "p".into(),
        };
        let first = login.open(who("mallory"), None).ok_or("no session")?;
        for _ in 0..100 {
            login.open(who("mallory"), None).ok_or("no session")?;
        }
        // Mallory holds her 32 newest sessions; the oldest went.
        assert!(login.visit(&first).is_none());
        assert_eq!(login.lock().len(), SESSIONS_PER_USER);
        // Others still log in.
        let alice = login.open(who("alice"), None).ok_or("alice refused")?;
        assert!(login.visit(&alice).is_some());
        Ok(())
    }

    /// A session ends when its user's password changes or the user goes:
    /// its pages signed in with the old password, and their failures held
    /// the console's own address off every SASL login.
    #[test]
    fn a_changed_password_ends_the_users_sessions() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(rokka_store::MessageStore::open(rokka_store::StoreConfig::for_tests(
            dir.path(),
        ))?);
        let broker = Arc::new(rokka_broker::Broker::new(store, rokka_broker::BrokerConfig::default())?);
        broker
            .users()
            .set_password("carol", "old", false)
            .map_err(|e| format!("{e:?}"))?;
        broker
            .users()
            .set_password("dave", "d", false)
            .map_err(|e| format!("{e:?}"))?;
        let login = Login::new(&crate::config::ConsoleConfig::default(), Arc::clone(&broker));
        let who = |u: &str, p: &str| admin::Credentials {
            user: u.into(),
            password: p.into(),
        };
        let print = |u: &str| broker.users().fingerprint(u);
        let carol = login.open(who("carol", "old"), print("carol")).ok_or("no session")?;
        let dave = login.open(who("dave", "d"), print("dave")).ok_or("no session")?;
        assert!(login.visit(&carol).is_some());
        // A login whose password was checked just before the change opens
        // with the credentials read then: it ends too.
        let before = print("carol");
        broker
            .users()
            .set_password("carol", "new", true)
            .map_err(|e| format!("{e:?}"))?;
        let late = login.open(who("carol", "old"), before).ok_or("no session")?;
        assert!(login.visit(&carol).is_none(), "the old password's session ended");
        assert!(login.visit(&late).is_none(), "a session opened across the change ended");
        assert!(login.visit(&dave).is_some(), "others' go on");
        broker.users().delete_user("dave").map_err(|e| format!("{e:?}"))?;
        assert!(login.visit(&dave).is_none(), "a deleted user's session ended");
        Ok(())
    }

    #[test]
    fn the_console_answers_to_addresses_localhost_and_its_allowed_names_only() {
        let c = Console::new(String::new(), String::new(), None, None, vec!["Console.Example".into()]);
        for ok in [
            "127.0.0.1:9180",
            "10.1.2.3",
            "[::1]:9180",
            "localhost:9180",
            "LOCALHOST",
            "console.example:443",
        ] {
            assert!(c.answers_to(ok), "{ok}");
        }
        for refused in [
            "evil.example:9180",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "[::1",
            "[evil]:80",
            "",
        ] {
            assert!(!c.answers_to(refused), "{refused}");
        }
    }
}
