//! I/O building blocks shared by the server's workers and the load generator: epoll, and one
//! TCP or TLS connection's buffers and framing.

pub mod conn;
pub mod epoll;

/// Lifts the open-file limit to its hard maximum: every TCP or TLS connection is a
/// descriptor, and the usual soft limit of 1024 would cap a server (or a bench holding idle
/// connections) at about that many.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a live rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
