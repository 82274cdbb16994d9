"""Apply one issue-19 lever variant to the working tree (measurement only;
`git checkout -- crates` undoes it). Variants: base (nothing), nocopy (the
pool's fill sets the length but copies nothing: the upper bound of what
receiving straight into pool buffers could save), cqe16/cqe256 (CQE_BATCH),
regfiles (every socket a registered file, slot = fd number, sends and
multishot receives with IOSQE_FIXED_FILE), sendzc (plain sends as SEND_ZC,
the buffer released on the notification).
"""
import os, sys
v = sys.argv[1]
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../crates/dataplane/src/')
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
else:
    raise SystemExit('unknown '+v)
