//! `sipsec lab`: the seeds' experiments run in rounds, and what can honestly be said about
//! them. Being built (issue 20); so far the statistics that decide when one row may be called
//! cheaper than another.

pub mod stats;
