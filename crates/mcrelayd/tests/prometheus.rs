//! mcrelayd with the real Prometheus (Debian's `prometheus` package), both
//! in the relay namespace R of the test topology (tests/common), Prometheus
//! listening on R's loopback only:
//!
//! - `promtool check metrics` finds nothing to complain about in a real
//!   scrape of the daemon (naming, units, suffixes);
//! - the shipped alert rules (deploy/prometheus/mcrelay-alerts.yml), loaded
//!   by a Prometheus server scraping the daemon every second: McrelayFlowDown
//!   goes to firing when the flow's input interface goes down and resolves
//!   when it comes back.
//!
//! Needs root and the `prometheus` package; skips with a message without
//! them, unless `MCRELAY_REQUIRE_PROMETHEUS` is set (CI's
//! .ci/steps/27-prometheus.sh sets it after installing the package), in
//! which case a missing package fails the test.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Topology, in_netns, wait_until, wait_within};

/// The daemon's metrics endpoint, in R.
const METRICS: &str = "127.0.0.1:9464";
/// Prometheus' web and API, on R's loopback.
const PROMETHEUS: &str = "127.0.0.1:9090";
/// The rules the package ships.
const RULES: &str = include_str!("../../../deploy/prometheus/mcrelay-alerts.yml");
/// The whole chain (a scrape a second, an evaluation a second, the
/// Prometheus start-up on a loaded machine) gets longer than one step.
const ALERT_DEADLINE: Duration = Duration::from_secs(180);

/// A Prometheus binary, or `None` (with the reason printed) where the test
/// may be skipped.
fn tool(name: &str) -> Option<()> {
    let found = Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(());
    }
    assert!(
        std::env::var_os("MCRELAY_REQUIRE_PROMETHEUS").is_none(),
        "{name} is not installed but MCRELAY_REQUIRE_PROMETHEUS is set"
    );
    eprintln!(
        "SKIPPED: {name} is not installed (apt-get install --no-install-recommends prometheus; \
         CI installs it without starting its service: .ci/steps/27-prometheus.sh)"
    );
    None
}

const FLOW: &str = r#"
[[flow]]
name = "main"
payload = "rtp-mpegts"
input = { interface = "vRA", address = "239.1.1.1", port = 5000 }
outputs = [ { interface = "vRB", address = "239.2.2.2", port = 6000 } ]
"#;

fn config(t: &Topology) -> String {
    format!(
        "[daemon]\nuser = \"nobody\"\ncontrol_socket = \"{}\"\nmetrics_listen = \"{METRICS}\"\n{FLOW}",
        t.dir.join("control.sock").display()
    )
}

/// `GET path` from `addr` inside namespace `ns`: the head (status line and
/// headers) and the body.
fn get(ns: &str, addr: &'static str, path: &str) -> Result<(String, String), String> {
    get_accepting(ns, addr, path, "*/*")
}

fn get_accepting(
    ns: &str,
    addr: &'static str,
    path: &str,
    accept: &str,
) -> Result<(String, String), String> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n");
    in_netns(ns, move || {
        let mut c = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        c.write_all(request.as_bytes())
            .map_err(|e| format!("request: {e}"))?;
        let mut reply = String::new();
        c.read_to_string(&mut reply)
            .map_err(|e| format!("reply: {e}"))?;
        let (head, body) = reply
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("no header end in {reply:?}"))?;
        Ok((head.to_owned(), body.to_owned()))
    })
}

/// A Prometheus API call (`/api/v1/...`): its `data`.
fn api(ns: &str, path: &str) -> Result<serde_json::Value, String> {
    let (status, body) = get(ns, PROMETHEUS, path)?;
    let json: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
    if json["status"] != "success" {
        return Err(format!("{path}: {status}: {body}"));
    }
    Ok(json["data"].clone())
}

/// The state ("pending", "firing") of alert `name` for flow `flow`, if
/// Prometheus has it active.
fn alert_state(ns: &str, name: &str, flow: &str) -> Result<Option<String>, String> {
    let data = api(ns, "/api/v1/alerts")?;
    let alerts = data["alerts"]
        .as_array()
        .ok_or_else(|| format!("no alerts list: {data}"))?;
    Ok(alerts
        .iter()
        .find(|a| a["labels"]["alertname"] == name && a["labels"]["flow"] == flow)
        .map(|a| a["state"].as_str().unwrap_or_default().to_owned()))
}

/// Poll `done` until it holds, for up to [`ALERT_DEADLINE`].
fn wait_long<T>(what: &str, done: impl FnMut() -> Result<T, String>) -> T {
    wait_within(ALERT_DEADLINE, what, done)
}

/// The rules as shipped, but every `for:` 2 s (the expressions untouched),
/// so a test sees pending, then firing, in seconds.
fn test_rules() -> String {
    let mut out = String::new();
    for line in RULES.lines() {
        match line.trim_start().strip_prefix("for:") {
            Some(_) => {
                let indent = line.len() - line.trim_start().len();
                out.push_str(&format!("{:indent$}for: 2s\n", ""));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// A Prometheus server in `ns`, killed and reaped on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_prometheus(t: &Topology) -> Server {
    let rules = t.dir.join("rules.yml");
    fs::write(&rules, test_rules()).expect("rules");
    let config = t.dir.join("prometheus.yml");
    fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: mcrelay\n    static_configs:\n      - targets: [\"{METRICS}\"]\n",
            rules.display()
        ),
    )
    .expect("prometheus.yml");
    let check = Command::new("promtool")
        .arg("check")
        .arg("config")
        .arg(&config)
        .output()
        .expect("promtool check config");
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let log = fs::File::create(t.dir.join("prometheus.log")).expect("log");
    let child = Command::new("ip")
        .args(["netns", "exec", &t.r, "prometheus"])
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            t.dir.join("prometheus-data").display()
        ))
        .arg(format!("--web.listen-address={PROMETHEUS}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn prometheus");
    Server(child)
}

fn prometheus_log(t: &Topology) -> String {
    fs::read_to_string(t.dir.join("prometheus.log")).unwrap_or_default()
}

#[test]
fn promtool_finds_no_problem_in_a_real_scrape() {
    let Some(t) = Topology::new() else { return };
    if tool("promtool").is_none() {
        return;
    }
    let relay = t.relay(&config(&t), &[]);
    // The stream-health families appear once the flow has run.
    let (status, body) = wait_until("a scrape with the input families", || {
        let (status, body) = get(&t.r, METRICS, "/metrics")?;
        if body.contains("mcrelay_input_silent{") {
            Ok((status, body))
        } else {
            Err(body)
        }
    });
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(
        status.contains("Content-Type: text/plain; version=0.0.4"),
        "{status}"
    );
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    lint.stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write to promtool");
    let out = lint.wait_with_output().expect("promtool");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}\non:\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Asked the way Prometheus asks, the daemon answers OpenMetrics (which
    // the Prometheus server of the next test parses on every scrape).
    let (head, open) =
        get_accepting(&t.r, METRICS, "/metrics", PROMETHEUS_ACCEPT).expect("OpenMetrics scrape");
    assert!(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(open.ends_with("\n# EOF\n"), "{open}");
    assert!(open.contains("\n# TYPE mcrelay_flow_received_packets counter\n"));
    relay.stop();
}

/// The `Accept` header Prometheus 2.x scrapes with.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[test]
fn flow_down_alert_fires_when_its_interface_goes_down_and_resolves_when_it_is_back() {
    let Some(t) = Topology::new() else { return };
    if tool("prometheus").is_none() || tool("promtool").is_none() {
        return;
    }
    let relay = t.relay(&config(&t), &[]);
    let server = start_prometheus(&t);
    let ns = t.r.clone();

    // Prometheus scrapes the daemon and has evaluated the rules once: the
    // flow is up, nothing fires for it.
    wait_long("the flow seen up by Prometheus", || {
        let data = api(
            &ns,
            "/api/v1/query?query=mcrelay_flow_up%7Bflow%3D%22main%22%7D",
        )
        .map_err(|e| format!("{e}\n{}", prometheus_log(&t)))?;
        match data["result"][0]["value"][1].as_str() {
            Some("1") => Ok(()),
            _ => Err(format!("{data}")),
        }
    });
    // Scraped as OpenMetrics (Prometheus asks for it first), the counters
    // keep the names the rules use: `_total` included.
    for series in [
        "mcrelay_flow_received_packets_total",
        "mcrelay_flow_dropped_packets_total",
        "mcrelay_input_rtp_lost_packets_total",
        "mcrelay_pool_exhausted_total",
    ] {
        let data = api(&ns, &format!("/api/v1/series?match%5B%5D={series}")).expect("series");
        assert!(
            data.as_array().is_some_and(|a| !a.is_empty()),
            "Prometheus has no {series}: {data}"
        );
    }
    wait_long("a rule evaluation", || {
        let data = api(&ns, "/api/v1/rules?type=alert")?;
        let rule = data["groups"][0]["rules"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == "McrelayFlowDown"))
            .cloned()
            .ok_or_else(|| format!("no McrelayFlowDown rule: {data}"))?;
        match rule["lastEvaluation"].as_str() {
            Some(at) if !at.starts_with("0001") && rule["health"] == "ok" => Ok(()),
            _ => Err(format!("{rule}")),
        }
    });
    assert_eq!(
        alert_state(&ns, "McrelayFlowDown", "main").expect("alerts"),
        None
    );

    t.ip(&t.r, &["link", "set", "vRA", "down"]);
    let down = Instant::now();
    let mut seen = Vec::new();
    wait_long("McrelayFlowDown firing", || {
        let state = alert_state(&ns, "McrelayFlowDown", "main")?;
        if seen.last() != Some(&state) {
            seen.push(state.clone());
        }
        match state.as_deref() {
            Some("firing") => Ok(()),
            _ => Err(format!("states seen: {seen:?}")),
        }
    });
    eprintln!(
        "McrelayFlowDown firing {:?} after the link went down (states seen: {seen:?})",
        down.elapsed()
    );

    t.ip(&t.r, &["link", "set", "vRA", "up"]);
    let up = Instant::now();
    wait_long("McrelayFlowDown resolved", || {
        match alert_state(&ns, "McrelayFlowDown", "main")? {
            None => Ok(()),
            Some(state) => Err(state),
        }
    });
    // Resolved because the flow relays again, not because the target
    // vanished: Prometheus still reads it up.
    let data = api(
        &ns,
        "/api/v1/query?query=mcrelay_flow_up%7Bflow%3D%22main%22%7D",
    )
    .expect("query");
    assert_eq!(data["result"][0]["value"][1], "1", "{data}");
    eprintln!(
        "McrelayFlowDown resolved {:?} after the link came back",
        up.elapsed()
    );

    drop(server);
    relay.stop();
}
