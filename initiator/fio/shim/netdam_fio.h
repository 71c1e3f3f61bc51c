/*
 * The C ABI between the fio shim (netdam_fio.c, which knows fio's structures) and the Rust engine
 * (src/lib.rs, which knows netdam's). Neither side sees the other's types: the shim hands over
 * plain settings, buffers and opaque cookies (the io_u pointers), and gets back sizes,
 * completions and errno values. Every function is safe to call from one fio thread at a time per
 * engine; none panics or unwinds (the Rust side catches panics and reports them as errors).
 *
 * Errors are reported as positive errno values, and the Rust side has already printed a message
 * to stderr that names the option at fault ("netdam: namespace=foo: ...").
 */
#ifndef NETDAM_FIO_H
#define NETDAM_FIO_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The engine's options as fio parsed them. NULL strings mean "not given". */
struct netdam_fio_settings {
	/* fio's job name, for messages. */
	const char *job;
	/* target=HOST:PORT (NULL: $NETDAM_TARGET, then 127.0.0.1:7800). */
	const char *target;
	/* namespace=NAME (a block namespace) ... */
	const char *namespace_name;
	/* ... or region=NAME (a byte-addressable memory region): exactly one of the two. */
	const char *region;
	/* sessions=N, 1 to 64. */
	uint32_t sessions;
	/* poll=busy|adaptive|blocking: how the fio thread waits for completions (default adaptive). */
	const char *poll;
	/* key=FILE: the tenant's key file (NULL: $NETDAM_KEY, then the default tenant's). */
	const char *key;
	/* encrypt=1: encrypted sessions (the bodies of all datagrams, both ways); needs a key. */
	uint32_t encrypt;
	/* coalesce=1 (the default): while many other I/Os are outstanding, a datagram with room for
	 * more I/Os waits briefly for the next one (see netdam_fio_commit); 0 sends each at once. */
	uint32_t coalesce;
	/* fio's own sync=1 (or sync=sync, sync=dsync): every write to a namespace carries FUA, so it
	 * is durable when it completes, as an O_SYNC or O_DSYNC write to a file would be. */
	uint32_t fua;
};

/* What netdam_fio_probe learned about the namespace or region. */
struct netdam_fio_space {
	/* Size in bytes: fio's file size. */
	uint64_t size_bytes;
	/* Offsets and lengths must be multiples of it (1 for a region). */
	uint32_t block_bytes;
};

/* What an I/O asks for (fio's DDIR_* mapped by the shim). */
enum netdam_fio_kind {
	NETDAM_FIO_READ = 0,
	NETDAM_FIO_WRITE = 1,
	/* DDIR_SYNC, DDIR_DATASYNC, DDIR_SYNC_FILE_RANGE: FLUSH on a namespace; on a region an
	 * acknowledged write is already as durable as the region can make it. */
	NETDAM_FIO_SYNC = 2,
	/* DDIR_TRIM: TRIM on a namespace; zeroes the range of a region. */
	NETDAM_FIO_TRIM = 3,
};

/* One finished I/O: the cookie given to netdam_fio_submit, and 0 or a positive errno. */
struct netdam_fio_completion {
	void *cookie;
	int32_t error;
};

struct netdam_fio_engine;

/* Validates the settings, connects once (blocking, no threads: fio may call this in its parent
 * process before forking jobs) and describes the namespace or region. 0 or an errno. */
int netdam_fio_probe(const struct netdam_fio_settings *settings, struct netdam_fio_space *space);

/* Starts an engine for one fio thread, in `*engine`: `settings.sessions` sessions, driven from
 * the calling thread only (no threads are started). `iodepth` bounds the I/Os in flight.
 * 0 or an errno. */
int netdam_fio_open(const struct netdam_fio_settings *settings, uint32_t iodepth, struct netdam_fio_engine **engine);

/* Queues one I/O of `len` bytes at `offset`, sent by the next netdam_fio_commit (or reap). For
 * READ and WRITE, `buffer` holds `len` bytes and must stay valid and untouched until the
 * completion carrying `cookie` is reaped; SYNC and TRIM ignore it (SYNC ignores `offset` and
 * `len` too). 0 when queued (a completion will follow), or an errno when it could not start (no
 * completion follows). */
int netdam_fio_submit(struct netdam_fio_engine *engine, uint32_t kind, uint64_t offset, void *buffer,
		      uint64_t len, void *cookie);

/* Sends the I/Os queued since the last commit, packing consecutive ones into datagrams while
 * they fit. With coalescing, while at least 8 other I/Os are outstanding (on the wire, or
 * finished and not yet reaped) a last datagram with room for another I/O of its last one's size
 * waits until the next I/O comes, until fewer than 8 are outstanding, or for 20 µs (a reap
 * checks all three; asleep in ppoll, the kernel's timer slack may add to the 20 µs): at depth,
 * fio hands over one I/O per completion, and two 4 KiB I/Os then share a datagram. */
void netdam_fio_commit(struct netdam_fio_engine *engine);

/* Sends what is queued, then waits for at least `min` completions (fewer if fewer are outstanding), for at most
 * `timeout_ns` (negative: no limit), and moves up to `max` of them into `out`. Returns how many. */
uint32_t netdam_fio_reap(struct netdam_fio_engine *engine, uint32_t min, uint32_t max, int64_t timeout_ns,
			 struct netdam_fio_completion *out);

/* Closes the sessions. Outstanding I/Os are abandoned. NULL is ignored. */
void netdam_fio_close(struct netdam_fio_engine *engine);

#ifdef __cplusplus
}
#endif

#endif
