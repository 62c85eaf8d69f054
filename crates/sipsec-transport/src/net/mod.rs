//! I/O building blocks shared by the server's workers and the load generator: epoll, and one
//! TCP, TLS or WebSocket connection's buffers and framing.

pub mod conn;
pub mod epoll;
pub mod names;
pub mod transport;
pub mod udp;
pub mod ws;

/// Sets an integer socket option (`setsockopt` at `level`); whether the kernel took it.
pub fn set_int_option(
    fd: std::os::fd::RawFd,
    level: libc::c_int,
    option: libc::c_int,
    value: libc::c_int,
) -> bool {
    // SAFETY: passing a live c_int of the declared size to setsockopt on the caller's socket.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            option,
            std::ptr::from_ref(&value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

/// Bytes the kernel holds in a TCP socket's send queue not yet sent (`SIOCOUTQNSD`: those the
/// peer's window has no room for; bytes in flight, awaiting acknowledgement, are not counted,
/// so a long path is not mistaken for a slow reader); 0 if the kernel does not say. The queue
/// autotunes to megabytes, so a sender judging whether its peer keeps up counts it beside its
/// own.
pub fn unsent_in_kernel(fd: std::os::fd::RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQNSD writes one c_int through the pointer, valid for it.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCOUTQNSD, &mut n) };
    if rc == 0 {
        usize::try_from(n).unwrap_or(0)
    } else {
        0
    }
}

/// Lifts the open-file limit: every TCP or TLS connection is a descriptor, and the usual soft
/// limit of 1024 would cap a server (or a bench holding idle connections) at about that many.
/// With the privilege to, the hard limit is raised too (to 1,048,576, the kernel's default
/// `nr_open`); otherwise the soft limit goes up to the hard one.
pub fn raise_fd_limit() {
    const WANTED: libc::rlim_t = 1 << 20;
    let Some(lim) = fd_limit_raw() else { return };
    if lim.rlim_cur >= WANTED {
        return;
    }
    let raised = libc::rlimit {
        rlim_cur: WANTED,
        rlim_max: WANTED.max(lim.rlim_max),
    };
    // SAFETY: setrlimit with live rlimit structs.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
            let soft_to_hard = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &soft_to_hard);
        }
    }
}

/// The open-file limit in force (the soft one): how many descriptors this process may hold.
/// None when it cannot be read or is unlimited.
pub fn fd_limit() -> Option<u64> {
    let lim = fd_limit_raw()?;
    (lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

fn fd_limit_raw() -> Option<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a live rlimit struct.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0).then_some(lim)
}
