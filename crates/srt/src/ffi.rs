//! The one place mcrelay calls libsrt: the C declarations (written by hand
//! from `srt/srt.h` of libsrt 1.5, no bindgen) and safe wrappers around
//! them. Every `unsafe` block of the crate is in this file.
//!
//! libsrt is thread-safe: its sockets are integer handles into its own
//! table, so a handle may be used from any thread and a stale one only
//! yields an error (`SRT_EINVSOCK`), never undefined behaviour.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_void};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

use socket2::SockAddr;

/// An SRT socket handle.
type RawSrt = c_int;

/// `SRT_SOCKOPT` values used here.
#[derive(Debug, Clone, Copy)]
#[repr(i32)]
pub enum Opt {
    Sndsyn = 1,
    Rcvsyn = 2,
    ReuseAddr = 15,
    Passphrase = 26,
    PbKeyLen = 27,
    Latency = 23,
    ConnTimeo = 36,
    StreamId = 46,
    PayloadSize = 49,
    TransType = 50,
    EnforcedEncryption = 53,
    Ipv6Only = 54,
    PeerIdleTimeo = 55,
    RetransmitAlgo = 61,
}

/// `SRT_SOCKSTATUS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Init,
    Opened,
    Listening,
    Connecting,
    Connected,
    Broken,
    Closing,
    Closed,
    NonExist,
}

impl State {
    fn from_raw(v: c_int) -> State {
        match v {
            1 => State::Init,
            2 => State::Opened,
            3 => State::Listening,
            4 => State::Connecting,
            5 => State::Connected,
            6 => State::Broken,
            7 => State::Closing,
            8 => State::Closed,
            _ => State::NonExist,
        }
    }

    /// The connection is over (or never existed).
    pub fn is_gone(self) -> bool {
        matches!(
            self,
            State::Broken | State::Closing | State::Closed | State::NonExist
        )
    }
}

/// `SRT_EASYNCSND`: the send buffer is full (non-blocking socket).
pub const ERR_ASYNC_SEND: i32 = 6001;
/// `SRT_EASYNCRCV`: nothing to receive or accept (non-blocking socket).
pub const ERR_ASYNC_RECV: i32 = 6002;
/// `SRT_ETIMEOUT`: an epoll wait timed out.
const ERR_TIMEOUT: i32 = 6003;
/// `SRTT_LIVE`.
const TRANSTYPE_LIVE: c_int = 0;
/// `SRT_EPOLL_IN`, `SRT_EPOLL_ERR`.
const EPOLL_IN: c_int = 0x1;
const EPOLL_ERR: c_int = 0x8;
/// `SRT_EPOLL_ENABLE_EMPTY`: waiting on an empty set is not an error.
const EPOLL_ENABLE_EMPTY: i32 = 1;
/// `LOG_ERR` from syslog.h.
const LOG_ERR: c_int = 3;
/// `SRT_REJX_OVERLOAD`, `SRT_REJX_NOTFOUND` (access control reasons).
pub const REJECT_OVERLOAD: i32 = 1402;
pub const REJECT_NOT_FOUND: i32 = 1404;
pub const REJECT_BAD_REQUEST: i32 = 1400;

/// `struct CBytePerfMon` (`SRT_TRACEBSTATS`) of libsrt 1.5, field for
/// field; `tests::stats_layout_matches_libsrt_1_5` checks its size and two
/// offsets against the C compiler's.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
#[allow(dead_code)]
struct TraceBStats {
    ms_timestamp: i64,
    pkt_sent_total: i64,
    pkt_recv_total: i64,
    pkt_snd_loss_total: c_int,
    pkt_rcv_loss_total: c_int,
    pkt_retrans_total: c_int,
    pkt_sent_ack_total: c_int,
    pkt_recv_ack_total: c_int,
    pkt_sent_nak_total: c_int,
    pkt_recv_nak_total: c_int,
    us_snd_duration_total: i64,
    pkt_snd_drop_total: c_int,
    pkt_rcv_drop_total: c_int,
    pkt_rcv_undecrypt_total: c_int,
    byte_sent_total: u64,
    byte_recv_total: u64,
    byte_rcv_loss_total: u64,
    byte_retrans_total: u64,
    byte_snd_drop_total: u64,
    byte_rcv_drop_total: u64,
    byte_rcv_undecrypt_total: u64,
    pkt_sent: i64,
    pkt_recv: i64,
    pkt_snd_loss: c_int,
    pkt_rcv_loss: c_int,
    pkt_retrans: c_int,
    pkt_rcv_retrans: c_int,
    pkt_sent_ack: c_int,
    pkt_recv_ack: c_int,
    pkt_sent_nak: c_int,
    pkt_recv_nak: c_int,
    mbps_send_rate: f64,
    mbps_recv_rate: f64,
    us_snd_duration: i64,
    pkt_reorder_distance: c_int,
    pkt_rcv_avg_belated_time: f64,
    pkt_rcv_belated: i64,
    pkt_snd_drop: c_int,
    pkt_rcv_drop: c_int,
    pkt_rcv_undecrypt: c_int,
    byte_sent: u64,
    byte_recv: u64,
    byte_rcv_loss: u64,
    byte_retrans: u64,
    byte_snd_drop: u64,
    byte_rcv_drop: u64,
    byte_rcv_undecrypt: u64,
    us_pkt_snd_period: f64,
    pkt_flow_window: c_int,
    pkt_congestion_window: c_int,
    pkt_flight_size: c_int,
    ms_rtt: f64,
    mbps_bandwidth: f64,
    byte_avail_snd_buf: c_int,
    byte_avail_rcv_buf: c_int,
    mbps_max_bw: f64,
    byte_mss: c_int,
    pkt_snd_buf: c_int,
    byte_snd_buf: c_int,
    ms_snd_buf: c_int,
    ms_snd_tsbpd_delay: c_int,
    pkt_rcv_buf: c_int,
    byte_rcv_buf: c_int,
    ms_rcv_buf: c_int,
    ms_rcv_tsbpd_delay: c_int,
    pkt_snd_filter_extra_total: c_int,
    pkt_rcv_filter_extra_total: c_int,
    pkt_rcv_filter_supply_total: c_int,
    pkt_rcv_filter_loss_total: c_int,
    pkt_snd_filter_extra: c_int,
    pkt_rcv_filter_extra: c_int,
    pkt_rcv_filter_supply: c_int,
    pkt_rcv_filter_loss: c_int,
    pkt_reorder_tolerance: c_int,
    pkt_sent_unique_total: i64,
    pkt_recv_unique_total: i64,
    byte_sent_unique_total: u64,
    byte_recv_unique_total: u64,
    pkt_sent_unique: i64,
    pkt_recv_unique: i64,
    byte_sent_unique: u64,
    byte_recv_unique: u64,
}

type ListenHook = unsafe extern "C" fn(
    opaque: *mut c_void,
    ns: RawSrt,
    hs_version: c_int,
    peer: *const libc::sockaddr,
    stream_id: *const c_char,
) -> c_int;

type LogHandler = unsafe extern "C" fn(
    opaque: *mut c_void,
    level: c_int,
    file: *const c_char,
    line: c_int,
    area: *const c_char,
    message: *const c_char,
);

// The library is named by build.rs (pkg-config, else `-lsrt`).
unsafe extern "C" {
    fn srt_startup() -> c_int;
    fn srt_create_socket() -> RawSrt;
    fn srt_bind(u: RawSrt, name: *const libc::sockaddr, namelen: c_int) -> c_int;
    fn srt_listen(u: RawSrt, backlog: c_int) -> c_int;
    fn srt_accept(u: RawSrt, addr: *mut libc::sockaddr, addrlen: *mut c_int) -> RawSrt;
    fn srt_listen_callback(lsn: RawSrt, hook: Option<ListenHook>, opaque: *mut c_void) -> c_int;
    fn srt_connect(u: RawSrt, name: *const libc::sockaddr, namelen: c_int) -> c_int;
    fn srt_close(u: RawSrt) -> c_int;
    fn srt_getpeername(u: RawSrt, name: *mut libc::sockaddr, namelen: *mut c_int) -> c_int;
    fn srt_setsockflag(u: RawSrt, opt: c_int, optval: *const c_void, optlen: c_int) -> c_int;
    fn srt_getsockflag(u: RawSrt, opt: c_int, optval: *mut c_void, optlen: *mut c_int) -> c_int;
    fn srt_send(u: RawSrt, buf: *const c_char, len: c_int) -> c_int;
    fn srt_recv(u: RawSrt, buf: *mut c_char, len: c_int) -> c_int;
    fn srt_getlasterror(errno_loc: *mut c_int) -> c_int;
    fn srt_getlasterror_str() -> *const c_char;
    fn srt_bistats(u: RawSrt, perf: *mut TraceBStats, clear: c_int, instantaneous: c_int) -> c_int;
    fn srt_getsockstate(u: RawSrt) -> c_int;
    fn srt_setrejectreason(u: RawSrt, value: c_int) -> c_int;
    fn srt_epoll_create() -> c_int;
    fn srt_epoll_add_usock(eid: c_int, u: RawSrt, events: *const c_int) -> c_int;
    fn srt_epoll_add_ssock(eid: c_int, s: c_int, events: *const c_int) -> c_int;
    fn srt_epoll_remove_usock(eid: c_int, u: RawSrt) -> c_int;
    fn srt_epoll_remove_ssock(eid: c_int, s: c_int) -> c_int;
    fn srt_epoll_set(eid: c_int, flags: i32) -> i32;
    #[allow(clippy::too_many_arguments)]
    fn srt_epoll_wait(
        eid: c_int,
        readfds: *mut RawSrt,
        rnum: *mut c_int,
        writefds: *mut RawSrt,
        wnum: *mut c_int,
        ms_timeout: i64,
        lrfds: *mut c_int,
        lrnum: *mut c_int,
        lwfds: *mut c_int,
        lwnum: *mut c_int,
    ) -> c_int;
    fn srt_epoll_release(eid: c_int) -> c_int;
    fn srt_setloglevel(level: c_int);
    fn srt_setloghandler(opaque: *mut c_void, handler: Option<LogHandler>);
}

/// A libsrt call that failed: its code (`SRT_E*`) and message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{op}: {message} (SRT error {code})")]
pub struct SrtError {
    pub op: &'static str,
    pub code: i32,
    pub message: String,
}

impl SrtError {
    /// The calling thread's last libsrt error.
    fn last(op: &'static str) -> SrtError {
        // SAFETY: srt_getlasterror reads the calling thread's error slot;
        // a null errno pointer is allowed (the system errno is not wanted).
        let code = unsafe { srt_getlasterror(std::ptr::null_mut()) };
        // SAFETY: no arguments; the pointer returned is checked below.
        let p = unsafe { srt_getlasterror_str() };
        let message = if p.is_null() {
            String::new()
        } else {
            // SAFETY: a non-null pointer from srt_getlasterror_str is a
            // NUL-terminated string owned by libsrt's per-thread error
            // object, valid until the next libsrt call on this thread; it
            // is copied out at once.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        SrtError { op, code, message }
    }
}

fn check(rc: c_int, op: &'static str) -> Result<(), SrtError> {
    if rc < 0 {
        Err(SrtError::last(op))
    } else {
        Ok(())
    }
}

static STARTUP: Once = Once::new();
/// libsrt log lines dropped by the rate limit.
static LOG_SUPPRESSED: AtomicU64 = AtomicU64::new(0);
/// Second (monotonic, coarse) and count of the current log window.
static LOG_WINDOW: AtomicU64 = AtomicU64::new(0);

/// Starts libsrt once per process and routes its error log (rate-limited
/// to 10 lines a second) into `tracing`.
pub fn startup() {
    STARTUP.call_once(|| {
        // SAFETY: srt_startup has no preconditions and is idempotent.
        unsafe { srt_startup() };
        // SAFETY: stores a plain value.
        unsafe { srt_setloglevel(LOG_ERR) };
        // SAFETY: the handler is a `'static` function matching
        // SRT_LOG_HANDLER_FN and takes no opaque state (null).
        unsafe { srt_setloghandler(std::ptr::null_mut(), Some(log_handler)) };
    });
}

/// Receives libsrt's log lines on libsrt's threads.
unsafe extern "C" fn log_handler(
    _opaque: *mut c_void,
    _level: c_int,
    _file: *const c_char,
    _line: c_int,
    _area: *const c_char,
    message: *const c_char,
) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let window = LOG_WINDOW.load(Ordering::Relaxed);
    let (second, count) = (window >> 8, window & 0xff);
    if second != now {
        LOG_WINDOW.store(now << 8, Ordering::Relaxed);
    } else if count >= 10 {
        LOG_SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        return;
    } else {
        LOG_WINDOW.store(window + 1, Ordering::Relaxed);
    }
    if message.is_null() {
        return;
    }
    // SAFETY: libsrt passes a NUL-terminated message valid for the call.
    let text = unsafe { CStr::from_ptr(message) }.to_string_lossy();
    tracing::warn!(target: "libsrt", "{}", text.trim_end());
}

/// libsrt log lines suppressed by the rate limit so far.
pub fn log_suppressed() -> u64 {
    LOG_SUPPRESSED.load(Ordering::Relaxed)
}

/// What the SRT side reads of one connection once a second.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ConnStats {
    /// Data packets sent, retransmissions included.
    pub packets_sent: u64,
    /// Packets retransmitted.
    pub retransmitted: u64,
    /// Packets the peer reported lost (NAKs, sender side).
    pub lost: u64,
    /// Packets the sender dropped as too late to deliver (`SNDDROP`).
    pub sender_dropped: u64,
    /// Packets received (an SRT input), lost and dropped on receipt.
    pub packets_received: u64,
    pub receive_lost: u64,
    pub receive_dropped: u64,
    /// Smoothed round-trip time, milliseconds.
    pub rtt_ms: f64,
    /// Sending rate over the last interval, Mb/s.
    pub send_mbps: f64,
    /// Receiving rate over the last interval, Mb/s.
    pub receive_mbps: f64,
    /// Packets sent and not yet acknowledged.
    pub flight: u64,
    /// The peer's flow window: packets its receive buffer can still take
    /// (0: it stopped reading).
    pub flow_window: u64,
    /// Packets in the send buffer (sent and unacknowledged, and not yet
    /// sent), and the time they span, milliseconds.
    pub send_buffer_packets: u64,
    pub send_buffer_ms: u64,
}

fn count(v: c_int) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn count64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A borrowed handle (the socket a listen hook is deciding about).
#[derive(Debug, Clone, Copy)]
pub struct SocketRef(RawSrt);

impl SocketRef {
    pub fn set_i32(self, opt: Opt, v: i32) -> Result<(), SrtError> {
        // SAFETY: optval points at a live i32 of the length given; libsrt
        // copies it before returning.
        check(
            unsafe {
                srt_setsockflag(
                    self.0,
                    opt as c_int,
                    (&raw const v).cast(),
                    c_int::try_from(size_of::<i32>()).unwrap_or(4),
                )
            },
            "srt_setsockflag",
        )
    }

    pub fn set_bool(self, opt: Opt, v: bool) -> Result<(), SrtError> {
        // libsrt reads boolean options as an int.
        self.set_i32(opt, i32::from(v))
    }

    pub fn set_str(self, opt: Opt, v: &str) -> Result<(), SrtError> {
        let len = c_int::try_from(v.len()).map_err(|_| SrtError {
            op: "srt_setsockflag",
            code: 0,
            message: "value too long".to_owned(),
        })?;
        // SAFETY: optval points at `len` readable bytes (a string option is
        // read by length, no NUL needed); libsrt copies them.
        check(
            unsafe { srt_setsockflag(self.0, opt as c_int, v.as_ptr().cast(), len) },
            "srt_setsockflag",
        )
    }

    /// Tells the caller why it is refused (`SRT_REJX_*`).
    pub fn reject_reason(self, reason: i32) {
        // SAFETY: a plain value stored on the socket; a stale handle only
        // makes the call fail.
        unsafe { srt_setrejectreason(self.0, reason) };
    }

    pub fn state(self) -> State {
        // SAFETY: reads the state of a handle; stale handles are NONEXIST.
        State::from_raw(unsafe { srt_getsockstate(self.0) })
    }

    pub fn id(self) -> i32 {
        self.0
    }
}

/// An owned SRT socket, closed on drop.
#[derive(Debug)]
pub struct Socket(RawSrt);

impl Socket {
    /// A new live-mode socket, non-blocking for sends, receives and
    /// connects.
    pub fn new_live() -> Result<Socket, SrtError> {
        startup();
        // SAFETY: no arguments; returns a handle or SRT_INVALID_SOCK.
        let raw = unsafe { srt_create_socket() };
        if raw < 0 {
            return Err(SrtError::last("srt_create_socket"));
        }
        let s = Socket(raw);
        s.as_ref().set_i32(Opt::TransType, TRANSTYPE_LIVE)?;
        s.as_ref().set_bool(Opt::Sndsyn, false)?;
        s.as_ref().set_bool(Opt::Rcvsyn, false)?;
        Ok(s)
    }

    pub fn as_ref(&self) -> SocketRef {
        SocketRef(self.0)
    }

    pub fn id(&self) -> i32 {
        self.0
    }

    pub fn bind(&self, addr: SocketAddr) -> Result<(), SrtError> {
        let sa = SockAddr::from(addr);
        // SAFETY: `sa` is a valid sockaddr of `sa.len()` bytes for the call.
        check(
            unsafe {
                srt_bind(
                    self.0,
                    sa.as_ptr().cast(),
                    c_int::try_from(sa.len()).unwrap_or(0),
                )
            },
            "srt_bind",
        )
    }

    pub fn listen(&self, backlog: i32) -> Result<(), SrtError> {
        // SAFETY: plain values.
        check(unsafe { srt_listen(self.0, backlog) }, "srt_listen")
    }

    /// Installs `hook` as the listener's access control: it runs on
    /// libsrt's receiving thread for each connection request, before the
    /// handshake completes; returning `false` refuses the caller.
    ///
    /// The hook is leaked on purpose: libsrt gives no guarantee that a
    /// hook call in progress has ended when the listener is closed, so it
    /// must live as long as the process (one small box per listener
    /// opened, which happens only at start and on reload).
    pub fn listen_callback(&self, hook: Box<ListenFn>) -> Result<(), SrtError> {
        let leaked: &'static ListenFn = Box::leak(hook);
        let boxed: &'static &'static ListenFn = Box::leak(Box::new(leaked));
        let opaque: *const &'static ListenFn = boxed;
        // SAFETY: `listen_trampoline` matches srt_listen_callback_fn and
        // reads `opaque` only as the `&'static &ListenFn` leaked above, which
        // is never freed; ListenFn is Sync, so calls from libsrt's thread
        // are sound.
        check(
            unsafe {
                srt_listen_callback(self.0, Some(listen_trampoline), opaque.cast_mut().cast())
            },
            "srt_listen_callback",
        )
    }

    /// One pending caller, if any (non-blocking).
    pub fn accept(&self) -> Result<Option<(Socket, Option<SocketAddr>)>, SrtError> {
        // SAFETY: sockaddr_storage is plain data; all-zero is valid.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = c_int::try_from(size_of::<libc::sockaddr_storage>()).unwrap_or(128);
        // SAFETY: `storage` is writable for `len` bytes, `len` is updated.
        let raw = unsafe { srt_accept(self.0, (&raw mut storage).cast(), &raw mut len) };
        if raw < 0 {
            let e = SrtError::last("srt_accept");
            return if e.code == ERR_ASYNC_RECV {
                Ok(None)
            } else {
                Err(e)
            };
        }
        Ok(Some((Socket(raw), sockaddr_of(&storage))))
    }

    /// Starts connecting (non-blocking: watch [`SocketRef::state`]).
    pub fn connect(&self, addr: SocketAddr) -> Result<(), SrtError> {
        let sa = SockAddr::from(addr);
        // SAFETY: `sa` is a valid sockaddr of `sa.len()` bytes for the call.
        check(
            unsafe {
                srt_connect(
                    self.0,
                    sa.as_ptr().cast(),
                    c_int::try_from(sa.len()).unwrap_or(0),
                )
            },
            "srt_connect",
        )
    }

    pub fn peer(&self) -> Option<SocketAddr> {
        // SAFETY: as in `accept`.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = c_int::try_from(size_of::<libc::sockaddr_storage>()).unwrap_or(128);
        // SAFETY: `storage` is writable for `len` bytes, `len` is updated.
        let rc = unsafe { srt_getpeername(self.0, (&raw mut storage).cast(), &raw mut len) };
        if rc < 0 { None } else { sockaddr_of(&storage) }
    }

    /// The stream ID the peer sent (empty when none).
    pub fn stream_id(&self) -> String {
        let mut buf = [0u8; 513];
        let mut len = c_int::try_from(buf.len()).unwrap_or(512);
        // SAFETY: `buf` is writable for `len` bytes; libsrt writes at most
        // that many and updates `len`.
        let rc = unsafe {
            srt_getsockflag(
                self.0,
                Opt::StreamId as c_int,
                buf.as_mut_ptr().cast(),
                &raw mut len,
            )
        };
        if rc < 0 {
            return String::new();
        }
        let n = usize::try_from(len).unwrap_or(0).min(buf.len());
        let bytes = buf.get(..n).unwrap_or(&[]);
        let bytes = bytes.split(|&b| b == 0).next().unwrap_or(&[]);
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// Sends one datagram as one live-mode message. `Err` with
    /// [`ERR_ASYNC_SEND`] when the send buffer is full.
    pub fn send(&self, data: &[u8]) -> Result<(), SrtError> {
        let len = c_int::try_from(data.len()).unwrap_or(c_int::MAX);
        // SAFETY: `data` is readable for `len` bytes; libsrt copies the
        // message into its send buffer before returning.
        let rc = unsafe { srt_send(self.0, data.as_ptr().cast(), len) };
        check(rc, "srt_send")
    }

    /// Receives one message into `buf`; `Ok(None)` when none is ready.
    pub fn recv(&self, buf: &mut [u8]) -> Result<Option<usize>, SrtError> {
        let len = c_int::try_from(buf.len()).unwrap_or(c_int::MAX);
        // SAFETY: `buf` is writable for `len` bytes.
        let rc = unsafe { srt_recv(self.0, buf.as_mut_ptr().cast(), len) };
        if rc < 0 {
            let e = SrtError::last("srt_recv");
            return if e.code == ERR_ASYNC_RECV {
                Ok(None)
            } else {
                Err(e)
            };
        }
        Ok(Some(usize::try_from(rc).unwrap_or(0)))
    }

    /// Cumulative statistics (`srt_bistats` without clearing), with the
    /// send buffer as it is now (`instantaneous`; not libsrt's moving
    /// average, which lags a backlog by about a second).
    pub fn stats(&self) -> Option<ConnStats> {
        let mut s = TraceBStats::default();
        // SAFETY: `s` is a `struct CBytePerfMon` of libsrt 1.5's layout
        // (checked by a test), writable for the call.
        let rc = unsafe { srt_bistats(self.0, &raw mut s, 0, 1) };
        (rc >= 0).then(|| ConnStats {
            packets_sent: count64(s.pkt_sent_total),
            retransmitted: count(s.pkt_retrans_total),
            lost: count(s.pkt_snd_loss_total),
            sender_dropped: count(s.pkt_snd_drop_total),
            packets_received: count64(s.pkt_recv_total),
            receive_lost: count(s.pkt_rcv_loss_total),
            receive_dropped: count(s.pkt_rcv_drop_total),
            rtt_ms: s.ms_rtt,
            send_mbps: s.mbps_send_rate,
            receive_mbps: s.mbps_recv_rate,
            flight: count(s.pkt_flight_size),
            flow_window: count(s.pkt_flow_window),
            send_buffer_packets: count(s.pkt_snd_buf),
            send_buffer_ms: count(s.ms_snd_buf),
        })
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: this handle is owned and closed exactly once.
        unsafe { srt_close(self.0) };
    }
}

/// A listen hook's view of one connection request.
#[derive(Debug)]
pub struct Request<'a> {
    /// The socket being accepted: set its passphrase or latency here.
    pub socket: SocketRef,
    pub peer: Option<SocketAddr>,
    pub stream_id: &'a str,
}

/// A listener's access control.
pub type ListenFn = dyn Fn(&Request<'_>) -> bool + Send + Sync;

unsafe extern "C" fn listen_trampoline(
    opaque: *mut c_void,
    ns: RawSrt,
    _hs_version: c_int,
    peer: *const libc::sockaddr,
    stream_id: *const c_char,
) -> c_int {
    if opaque.is_null() {
        return -1;
    }
    // SAFETY: `opaque` is the `&'static &'static ListenFn` leaked in
    // `listen_callback`, never freed.
    let hook: &ListenFn = unsafe { *opaque.cast::<&'static ListenFn>() };
    let peer = if peer.is_null() {
        None
    } else {
        // SAFETY: libsrt passes the peer's sockaddr, sized for its family.
        unsafe { sockaddr_ptr(peer) }
    };
    let id = if stream_id.is_null() {
        std::borrow::Cow::Borrowed("")
    } else {
        // SAFETY: libsrt passes a NUL-terminated stream ID valid for the call.
        unsafe { CStr::from_ptr(stream_id) }.to_string_lossy()
    };
    let req = Request {
        socket: SocketRef(ns),
        peer,
        stream_id: &id,
    };
    if hook(&req) { 0 } else { -1 }
}

fn sockaddr_of(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    let p: *const libc::sockaddr_storage = storage;
    // SAFETY: a sockaddr_storage is large enough for either family.
    unsafe { sockaddr_ptr(p.cast()) }
}

/// # Safety
/// `p` must point at a readable sockaddr whose size fits its family.
unsafe fn sockaddr_ptr(p: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees at least a sockaddr header.
    let family = c_int::from(unsafe { (*p).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in (caller's contract).
            let a = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6 (caller's contract).
            let a = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// An SRT epoll set over SRT sockets and system fds.
#[derive(Debug)]
pub struct Poll {
    eid: c_int,
    srt_ready: Vec<RawSrt>,
    sys_ready: Vec<c_int>,
}

/// Most ready sockets reported by one wait (the rest wait for the next).
pub(crate) const READY_MAX: usize = 1024;

impl Poll {
    pub fn new() -> Result<Poll, SrtError> {
        startup();
        // SAFETY: no arguments.
        let eid = unsafe { srt_epoll_create() };
        if eid < 0 {
            return Err(SrtError::last("srt_epoll_create"));
        }
        // SAFETY: sets a flag on the epoll id just created.
        unsafe { srt_epoll_set(eid, EPOLL_ENABLE_EMPTY) };
        Ok(Poll {
            eid,
            srt_ready: vec![0; READY_MAX],
            sys_ready: vec![0; READY_MAX],
        })
    }

    /// Watches `s` for reading (and errors: a broken connection is
    /// reported readable).
    pub fn add(&self, s: SocketRef) -> Result<(), SrtError> {
        let events = EPOLL_IN | EPOLL_ERR;
        // SAFETY: `events` lives for the call; libsrt copies it.
        check(
            unsafe { srt_epoll_add_usock(self.eid, s.0, &raw const events) },
            "srt_epoll_add_usock",
        )
    }

    pub fn remove(&self, s: SocketRef) {
        // SAFETY: plain values; removing an unknown socket is an error only.
        unsafe { srt_epoll_remove_usock(self.eid, s.0) };
    }

    /// Watches system fd `fd` for reading.
    pub fn add_fd(&self, fd: c_int) -> Result<(), SrtError> {
        let events = EPOLL_IN;
        // SAFETY: `events` lives for the call; libsrt copies it. libsrt only
        // adds the fd to its system epoll; it never closes it.
        check(
            unsafe { srt_epoll_add_ssock(self.eid, fd, &raw const events) },
            "srt_epoll_add_ssock",
        )
    }

    pub fn remove_fd(&self, fd: c_int) {
        // SAFETY: plain values.
        unsafe { srt_epoll_remove_ssock(self.eid, fd) };
    }

    /// Waits up to `timeout_ms`; the ready SRT sockets and system fds.
    pub fn wait(&mut self, timeout_ms: i64) -> Result<(&[i32], &[c_int]), SrtError> {
        let mut rnum = c_int::try_from(self.srt_ready.len()).unwrap_or(0);
        let mut lrnum = c_int::try_from(self.sys_ready.len()).unwrap_or(0);
        // SAFETY: both arrays are writable for the counts given, which
        // libsrt updates to how many it wrote; the write sets are null.
        let rc = unsafe {
            srt_epoll_wait(
                self.eid,
                self.srt_ready.as_mut_ptr(),
                &raw mut rnum,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                timeout_ms,
                self.sys_ready.as_mut_ptr(),
                &raw mut lrnum,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            let e = SrtError::last("srt_epoll_wait");
            if e.code == ERR_TIMEOUT {
                return Ok((&[], &[]));
            }
            return Err(e);
        }
        let r = usize::try_from(rnum).unwrap_or(0).min(self.srt_ready.len());
        let l = usize::try_from(lrnum)
            .unwrap_or(0)
            .min(self.sys_ready.len());
        Ok((
            self.srt_ready.get(..r).unwrap_or(&[]),
            self.sys_ready.get(..l).unwrap_or(&[]),
        ))
    }
}

impl Drop for Poll {
    fn drop(&mut self) {
        // SAFETY: this epoll id is owned and released once.
        unsafe { srt_epoll_release(self.eid) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_layout_matches_libsrt_1_5() {
        // sizeof and offsetof from gcc on srt/srt.h of libsrt 1.5.1.
        assert_eq!(size_of::<TraceBStats>(), 496);
        assert_eq!(std::mem::offset_of!(TraceBStats, ms_rtt), 328);
        assert_eq!(
            std::mem::offset_of!(TraceBStats, pkt_sent_unique_total),
            432
        );
    }

    #[test]
    fn options_match_the_header() {
        // SRTO_STREAMID, SRTO_PAYLOADSIZE, SRTO_ENFORCEDENCRYPTION and
        // SRTO_PEERIDLETIMEO follow SRTO_RCVLATENCY (43) in the enum.
        assert_eq!(Opt::StreamId as i32, 46);
        assert_eq!(Opt::PayloadSize as i32, 49);
        assert_eq!(Opt::EnforcedEncryption as i32, 53);
        assert_eq!(Opt::PeerIdleTimeo as i32, 55);
    }
}
