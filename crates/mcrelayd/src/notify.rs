//! The systemd notification protocol (`sd_notify(3)`), without libsystemd.
//!
//! Under `Type=notify` systemd passes the path of a Unix datagram socket in
//! `NOTIFY_SOCKET` (a file path, or `@name` for an abstract socket) and
//! expects newline-separated `KEY=value` datagrams on it: `READY=1` when
//! start-up finished, `RELOADING=1` … `READY=1` around a reload,
//! `STOPPING=1` on shutdown, `STATUS=` text for `systemctl status`, and
//! `WATCHDOG=1` keep-alives more often than `WATCHDOG_USEC`. The kernel
//! attaches our credentials to each datagram, which is how systemd applies
//! `NotifyAccess=main`.
//!
//! Nothing here touches the environment beyond reading it: whether to unset
//! `NOTIFY_SOCKET` and `WATCHDOG_*` before spawning children is the daemon's
//! decision. Every call returns the send error instead of hiding it, and
//! nothing panics.

use std::ffi::OsStr;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// systemd reads notifications into a buffer of this size and drops longer
/// datagrams whole (`NOTIFY_BUFFER_MAX`).
const MAX_DATAGRAM: usize = 4096;

/// How long a send may wait when systemd's receive queue is full; a stuck
/// service manager must not stall the caller (e.g. the watchdog loop).
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// The notifier systemd asked for through `NOTIFY_SOCKET`, or `None`
    /// when the variable is unset or empty (not started by systemd with
    /// `Type=notify`). A set but unusable value is reported on stderr and
    /// also gives `None`: the daemon runs on, and systemd's start timeout
    /// says the rest.
    pub fn from_env() -> Option<Notifier> {
        let value = std::env::var_os("NOTIFY_SOCKET")?;
        if value.is_empty() {
            return None;
        }
        match Notifier::new(&value) {
            Ok(notifier) => Some(notifier),
            Err(e) => {
                crate::journal::eprint_error(&format_args!(
                    "mcrelayd: NOTIFY_SOCKET={}: {e}; not notifying systemd",
                    value.to_string_lossy()
                ));
                None
            }
        }
    }

    /// A notifier sending to `notify_socket`, written as in
    /// `NOTIFY_SOCKET`: an absolute path, or `@name` for the abstract
    /// socket `name`.
    pub fn new(notify_socket: impl AsRef<OsStr>) -> io::Result<Notifier> {
        let addr = parse_address(notify_socket.as_ref())?;
        let socket = UnixDatagram::unbound()?;
        socket.set_write_timeout(Some(SEND_TIMEOUT))?;
        Ok(Notifier { socket, addr })
    }

    /// `READY=1`, start-up (or a reload) finished, and `STATUS=text` in
    /// one datagram, so `systemctl status`
    /// has the text from the moment the unit is active (sent apart, the
    /// status would wait for the next update). The text is made one line
    /// and cut as for [`status`](Self::status).
    pub fn ready_with_status(&self, text: &str) -> io::Result<()> {
        self.send(&format!(
            "READY=1\n{}",
            status_message(text, MAX_DATAGRAM - 8)
        ))
    }

    /// `RELOADING=1` with `MONOTONIC_USEC=` (the time of the call), which
    /// systemd 253+ uses to tell this reload from an earlier one. Follow it
    /// with [`ready_with_status`](Self::ready_with_status) once the new configuration is active (or
    /// rejected and the old one kept).
    pub fn reloading(&self) -> io::Result<()> {
        match monotonic_usec() {
            Some(usec) => self.send(&format!("RELOADING=1\nMONOTONIC_USEC={usec}")),
            // Without a timestamp systemd accepts the notification as
            // current, which is what it is.
            None => self.send("RELOADING=1"),
        }
    }

    /// `STOPPING=1`: shutdown began.
    pub fn stopping(&self) -> io::Result<()> {
        self.send("STOPPING=1")
    }

    /// `STATUS=text`, shown by `systemctl status`. Control characters
    /// (newlines included, which would start a new assignment) become
    /// spaces, and the text is cut to fit systemd's datagram limit.
    pub fn status(&self, text: &str) -> io::Result<()> {
        self.send(&status_message(text, MAX_DATAGRAM))
    }

    /// `WATCHDOG=1`: the keep-alive. Send it at least every
    /// [`watchdog_interval`](Self::watchdog_interval) / 2.
    pub fn watchdog(&self) -> io::Result<()> {
        self.send("WATCHDOG=1")
    }

    /// The watchdog timeout systemd expects keep-alives within
    /// (`WATCHDOG_USEC`), or `None` when the watchdog is off or meant for
    /// another process (`WATCHDOG_PID` set to a pid that is not ours).
    /// Reads the environment at each call.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        let usec = std::env::var_os("WATCHDOG_USEC");
        let pid = std::env::var_os("WATCHDOG_PID");
        watchdog_interval_from(usec.as_deref(), pid.as_deref(), std::process::id())
    }

    fn send(&self, message: &str) -> io::Result<()> {
        let sent = self.socket.send_to_addr(message.as_bytes(), &self.addr)?;
        if sent == message.len() {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "notification truncated: {sent} of {} bytes sent",
                    message.len()
                ),
            ))
        }
    }
}

/// `NOTIFY_SOCKET` syntax: `/absolute/path` or `@abstract-name`.
fn parse_address(value: &OsStr) -> io::Result<SocketAddr> {
    let bytes = value.as_bytes();
    match bytes.first() {
        Some(b'/') => SocketAddr::from_pathname(value),
        Some(b'@') if bytes.len() > 1 => SocketAddr::from_abstract_name(&bytes[1..]),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "expected an absolute socket path or @abstract-name \
             (vsock: addresses are not supported)",
        )),
    }
}

/// `STATUS=text` on one line, within `max` bytes.
fn status_message(text: &str, max: usize) -> String {
    const KEY: &str = "STATUS=";
    let mut message = String::with_capacity(KEY.len() + text.len().min(max));
    message.push_str(KEY);
    for c in text.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if message.len() + c.len_utf8() > max {
            break;
        }
        message.push(c);
    }
    message
}

/// `WATCHDOG_USEC`/`WATCHDOG_PID` as `sd_watchdog_enabled(3)` reads them:
/// the timeout must be a positive number of microseconds (not
/// `USEC_INFINITY`), and a pid, when given, must be ours.
fn watchdog_interval_from(
    usec: Option<&OsStr>,
    pid: Option<&OsStr>,
    our_pid: u32,
) -> Option<Duration> {
    let usec: u64 = usec?.to_str()?.parse().ok()?;
    if usec == 0 || usec == u64::MAX {
        return None;
    }
    if let Some(pid) = pid {
        let pid: u32 = pid.to_str()?.parse().ok()?;
        if pid != our_pid {
            return None;
        }
    }
    Some(Duration::from_micros(usec))
}

/// `CLOCK_MONOTONIC` now, in microseconds: the clock systemd compares
/// `MONOTONIC_USEC=` against. `None` only if the clock can't be read (the
/// caller then leaves the field out).
fn monotonic_usec() -> Option<u64> {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).ok()?;
    let sec = u64::try_from(now.tv_sec()).ok()?;
    let usec = u64::try_from(now.tv_nsec()).ok()? / 1_000;
    sec.checked_mul(1_000_000)?.checked_add(usec)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::PathBuf;

    /// A bound receiving socket in a fresh directory, removed on drop.
    struct Receiver {
        socket: UnixDatagram,
        dir: PathBuf,
    }

    impl Receiver {
        fn new(name: &str) -> (Receiver, PathBuf) {
            let dir =
                std::env::temp_dir().join(format!("mcrelayd-notify-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("notify.sock");
            let socket = UnixDatagram::bind(&path).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(60)))
                .unwrap();
            (Receiver { socket, dir }, path)
        }

        fn recv(&self) -> String {
            let mut buf = vec![0; MAX_DATAGRAM + 1];
            let n = self.socket.recv(&mut buf).expect("a notification");
            String::from_utf8(buf[..n].to_vec()).unwrap()
        }
    }

    impl Drop for Receiver {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn sends_each_notification_as_one_datagram() {
        let (rx, path) = Receiver::new("path");
        let n = Notifier::new(&path).unwrap();

        n.ready_with_status("up").unwrap();
        assert_eq!(rx.recv(), "READY=1\nSTATUS=up");

        n.status("relaying 3 flows").unwrap();
        assert_eq!(rx.recv(), "STATUS=relaying 3 flows");

        n.watchdog().unwrap();
        assert_eq!(rx.recv(), "WATCHDOG=1");

        n.stopping().unwrap();
        assert_eq!(rx.recv(), "STOPPING=1");
    }

    #[test]
    fn ready_and_status_travel_together() {
        let (rx, path) = Receiver::new("ready-status");
        let n = Notifier::new(&path).unwrap();

        n.ready_with_status("running; 2 flows\nREADY=0").unwrap();
        assert_eq!(rx.recv(), "READY=1\nSTATUS=running; 2 flows READY=0");

        let long = "x".repeat(2 * MAX_DATAGRAM);
        n.ready_with_status(&long).unwrap();
        let message = rx.recv();
        assert!(message.starts_with("READY=1\nSTATUS=xxx"), "{message:.40}");
        assert_eq!(message.len(), MAX_DATAGRAM);
    }

    #[test]
    fn reloading_carries_the_monotonic_time() {
        let (rx, path) = Receiver::new("reload");
        let n = Notifier::new(&path).unwrap();

        let before = monotonic_usec().expect("monotonic clock");
        n.reloading().unwrap();
        let after = monotonic_usec().expect("monotonic clock");

        let message = rx.recv();
        let usec = message
            .strip_prefix("RELOADING=1\nMONOTONIC_USEC=")
            .unwrap_or_else(|| panic!("unexpected datagram {message:?}"));
        let usec: u64 = usec.parse().unwrap();
        assert!(
            before <= usec && usec <= after,
            "{before} <= {usec} <= {after}"
        );
    }

    #[test]
    fn monotonic_clock_counts_microseconds() {
        let t0 = std::time::Instant::now();
        let a = monotonic_usec().expect("CLOCK_MONOTONIC");
        std::thread::sleep(Duration::from_millis(50));
        let b = monotonic_usec().expect("CLOCK_MONOTONIC");
        let elapsed = u64::try_from(t0.elapsed().as_micros()).unwrap();
        let delta = b - a;
        assert!(
            (50_000..=elapsed + 1_000).contains(&delta),
            "slept 50 ms, {elapsed} µs elapsed, clock moved {delta} µs"
        );
        // CLOCK_MONOTONIC never runs ahead of CLOCK_BOOTTIME (/proc/uptime,
        // printed in hundredths of a second).
        if let Ok(uptime) = std::fs::read_to_string("/proc/uptime") {
            let boot: f64 = uptime.split_whitespace().next().unwrap().parse().unwrap();
            let mono = Duration::from_micros(monotonic_usec().unwrap()).as_secs_f64();
            assert!(mono <= boot + 0.02, "monotonic {mono} s > uptime {boot} s");
        }
    }

    #[test]
    fn status_stays_on_one_line_and_fits() {
        let (rx, path) = Receiver::new("status");
        let n = Notifier::new(&path).unwrap();

        n.status("line one\nREADY=1\r\0tab\tend").unwrap();
        assert_eq!(rx.recv(), "STATUS=line one READY=1  tab end");

        // Cut at a character boundary, within the datagram limit.
        let long = "é".repeat(MAX_DATAGRAM);
        n.status(&long).unwrap();
        let message = rx.recv();
        assert!(message.len() <= MAX_DATAGRAM, "{} bytes", message.len());
        assert!(message.len() > MAX_DATAGRAM - 2);
        assert!(
            message
                .strip_prefix("STATUS=")
                .unwrap()
                .chars()
                .all(|c| c == 'é')
        );
    }

    #[test]
    fn abstract_socket() {
        let name = format!("mcrelayd-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(60))).unwrap();

        let n = Notifier::new(format!("@{name}")).unwrap();
        n.ready_with_status("up").unwrap();
        let mut buf = [0; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=up");
    }

    #[test]
    fn rejects_addresses_systemd_would_not_give() {
        for bad in ["", "@", "relative/notify.sock", "vsock:2:1234"] {
            let err = Notifier::new(bad).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        let too_long = format!("/{}", "x".repeat(200));
        assert!(Notifier::new(too_long).is_err());
    }

    #[test]
    fn send_errors_are_returned() {
        let (rx, path) = Receiver::new("gone");
        let n = Notifier::new(&path).unwrap();
        drop(rx); // removes the socket
        assert!(n.ready_with_status("up").is_err());
        assert!(n.watchdog().is_err());
    }

    #[test]
    fn watchdog_interval_follows_sd_watchdog_enabled() {
        let os = |s: &'static str| Some(OsStr::new(s));
        let ten_s = Some(Duration::from_secs(10));

        assert_eq!(watchdog_interval_from(os("10000000"), None, 42), ten_s);
        assert_eq!(watchdog_interval_from(os("10000000"), os("42"), 42), ten_s);
        assert_eq!(watchdog_interval_from(os("10000000"), os("43"), 42), None);
        assert_eq!(watchdog_interval_from(os("10000000"), os("x"), 42), None);
        assert_eq!(watchdog_interval_from(None, os("42"), 42), None);
        assert_eq!(watchdog_interval_from(os("0"), None, 42), None);
        assert_eq!(watchdog_interval_from(os("-5"), None, 42), None);
        assert_eq!(watchdog_interval_from(os("ten"), None, 42), None);
        assert_eq!(watchdog_interval_from(os(""), None, 42), None);
        assert_eq!(
            watchdog_interval_from(os("18446744073709551615"), None, 42),
            None
        );
        assert_eq!(
            watchdog_interval_from(os("500"), None, 42),
            Some(Duration::from_micros(500))
        );
    }
}
