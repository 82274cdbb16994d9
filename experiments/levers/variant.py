"""Apply one issue-19 lever variant to the working tree (measurement only;
`git checkout -- crates` undoes it). Variants: base (nothing), nocopy (the
pool's fill sets the length but copies nothing: the upper bound of what
receiving straight into pool buffers could save), cqe16/cqe256 (CQE_BATCH),
regfiles (every socket a registered file, slot = fd number, sends and
multishot receives with IOSQE_FIXED_FILE), sendzc (plain sends as SEND_ZC,
the buffer released on the notification), napi / napiN (io_uring NAPI busy
polling on the worker's ring, N µs busy-poll timeout, default 50, prefer busy
poll on; static tracking: the worker adds its input sockets' NAPI id, read
with SO_INCOMING_NAPI_ID on each loop turn until one has one, and logs it).
"""
import os, sys
v = sys.argv[1]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../crates/uring/src/')
def rep(path,a,b):
    p=root+path; s=open(p).read()
    assert a in s,(path,a)
    open(p,'w').write(s.replace(a,b,1))
if v=='base':
    pass
elif v=='nocopy':
    rep('../../pool/src/storage.rs','''        unsafe {
            std::ptr::copy_nonoverlapping(payload.as_ptr(), buf.ptr.as_ptr(), payload.len());
        }''','''        let _ = payload.as_ptr();''')
elif v.startswith('cqe'):
    rep('worker/driver.rs','pub(super) const CQE_BATCH: usize = 64;','pub(super) const CQE_BATCH: usize = %s;'%v[3:])
elif v=='regfiles':
    rep('worker/driver.rs','''        let receive_buffers = ReceiveBuffers::new(entries, 0).map_err(uring_err)?;''','''        uring.submitter().register_files_sparse(4096).map_err(uring_err)?;
        let receive_buffers = ReceiveBuffers::new(entries, 0).map_err(uring_err)?;''')
    rep('worker/driver.rs','''        for f in self.ids() {
            self.arm_receives(f);''','''        for fl in self.flows.iter().flatten() {
            for &fd in fl.output_fds.iter() {
                self.uring.submitter().register_files_update(fd as u32, &[fd]).map_err(|source| WorkerError::Enter { worker, source })?;
            }
            for l in &fl.legs {
                self.uring.submitter().register_files_update(l.fd as u32, &[l.fd]).map_err(|source| WorkerError::Enter { worker, source })?;
            }
        }
        for f in self.ids() {
            self.arm_receives(f);''')
    rep('submit.rs','let entry = opcode::Send::new(Fd(fd), buf.as_ptr(), len)','let entry = opcode::Send::new(io_uring::types::Fixed(fd as u32), buf.as_ptr(), len)')
    rep('submit.rs','let entry = opcode::SendMsg::new(Fd(fd), msg)','let entry = opcode::SendMsg::new(io_uring::types::Fixed(fd as u32), msg)')
    rep('worker/receive.rs','opcode::RecvMulti::new(Fd(leg.fd), self.receive_buffers.group())','opcode::RecvMulti::new(io_uring::types::Fixed(leg.fd as u32), self.receive_buffers.group())')
elif v=='sendzc':
    rep('submit.rs','let entry = opcode::Send::new(Fd(fd), buf.as_ptr(), len)','let entry = opcode::SendZc::new(Fd(fd), buf.as_ptr(), len)')
    rep('worker/driver.rs','''            Some(u) => {
                if let Some(token) = u.token() {''','''            Some(u) => {
                let flags = cqe.flags();
                if cqueue::more(flags) && cqe.result() >= 0 {
                    return;
                }
                let result = if cqueue::notif(flags) { 1 } else { cqe.result() };
                if let Some(token) = u.token() {''')
    rep('worker/driver.rs','''                    core.complete(token, cqe.result(), &mut |req, inf| {''','''                    core.complete(token, result, &mut |req, inf| {''')
elif v.startswith('napi'):
    us = int(v[4:] or 50)
    # Registered at the start of run(): static tracking, because dynamic
    # tracking learns a socket's id only when a poll is armed on it, and
    # the worker arms its multishot receives before the first datagram
    # (when the socket has no NAPI id yet).
    rep('worker/driver.rs', '''        let mut stopping: Option<Instant> = None;
        loop {''', '''        let mut stopping: Option<Instant> = None;
        let mut napi = io_uring::types::Napi::new()
            .set_busy_poll_timeout(%d)
            .set_prefer_busy_poll(true)
            .set_tracking(io_uring::types::NapiTracking::Static);
        self.uring
            .submitter()
            .register_napi(&mut napi)
            .map_err(|source| WorkerError::Enter { worker, source })?;
        tracing::info!(worker, busy_poll_us = %d, "napi variant: NAPI busy polling registered");
        let mut napi_ids: Vec<u32> = Vec::new();
        loop {''' % (us, us))
    rep('worker/driver.rs', '''            self.loop_counters.turns.inc();''', '''            self.loop_counters.turns.inc();
            if napi_ids.is_empty() {
                for fl in self.flows.iter().flatten() {
                    for l in &fl.legs {
                        let mut id: u32 = 0;
                        let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
                        // SAFETY: id and len are live locals of the sizes passed.
                        let rc = unsafe {
                            libc::getsockopt(
                                l.fd,
                                libc::SOL_SOCKET,
                                libc::SO_INCOMING_NAPI_ID,
                                (&raw mut id).cast(),
                                &raw mut len,
                            )
                        };
                        if rc == 0 && id != 0 && !napi_ids.contains(&id) {
                            self.uring
                                .submitter()
                                .register_napi_add_id(id)
                                .map_err(|source| WorkerError::Enter { worker, source })?;
                            napi_ids.push(id);
                            tracing::info!(worker, napi_id = id, "napi variant: busy polling the input's NAPI id");
                        }
                    }
                }
            }''')
else:
    raise SystemExit('unknown '+v)
