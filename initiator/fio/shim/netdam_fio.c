/*
 * netdam's fio ioengine, the fio half: fills fio's `struct ioengine_ops` and option table and
 * translates between fio's structures and the small C ABI of netdam_fio.h, which the Rust half
 * (src/lib.rs) implements. Load it with `ioengine=external:/path/to/libnetdam_fio.so`.
 *
 * Compiled against the headers of the fio that loads it (Debian bookworm's fio 3.33, from its
 * source package, configured as Debian configures it): fio has no stable plugin ABI. The fields
 * used here (td->o, td->eo, td->io_ops_data, td->files, td->error, td->verror and the io_u fields
 * up to engine_data) come before every part of those structs that depends on configure's
 * CONFIG_* choices, so a config-host.h generated on this machine lays them out as Debian's does.
 *
 * Only fio symbols that every fio build exports are used (none, in fact, beyond the inline
 * helpers of the headers): td_verror() and log_err() are absent from some builds, so errors are
 * recorded in td->error / io_u->error directly and messages go to stderr from the Rust half.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fio.h"
#include "optgroup.h"

#include "netdam_fio.h"

/* The engine is built and tested against this version of the ops table; another fio needs its
 * own headers and a look at what changed. */
_Static_assert(FIO_IOOPS_VERSION == 31, "netdam's fio engine is written for FIO_IOOPS_VERSION 31 (fio 3.33)");

#define NETDAM_SESSIONS_MAX 64

/* The engine's options, as fio parses them into td->eo. */
struct netdam_fio_options {
	/* fio keeps a thread_data pointer at offset 0 of an engine's option struct (and an
	 * option at offset 0 would read as "no offset"). */
	void *pad;
	char *target;
	char *namespace_name;
	char *region;
	unsigned int sessions;
	char *poll;
	char *key;
	unsigned int encrypt;
	unsigned int coalesce;
};

static struct fio_option options[] = {
	{
		.name = "target",
		.lname = "netdam target",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct netdam_fio_options, target),
		/* No default here: when target= is not given, the engine takes $NETDAM_TARGET, then
		 * 127.0.0.1:7800. (A job file cannot say target=${NETDAM_TARGET} for an unset
		 * variable: fio refuses an option with an empty value.) */
		.help = "Address of the netdam target, HOST:PORT (default $NETDAM_TARGET, then 127.0.0.1:7800)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "namespace",
		.lname = "netdam namespace",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct netdam_fio_options, namespace_name),
		.help = "Block namespace to run on, by name or id (or give region=)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "region",
		.lname = "netdam region",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct netdam_fio_options, region),
		.help = "Memory region to run on, by name or id (or give namespace=)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "sessions",
		.lname = "netdam sessions",
		.type = FIO_OPT_INT,
		.off1 = offsetof(struct netdam_fio_options, sessions),
		.def = "1",
		.minval = 1,
		.maxval = NETDAM_SESSIONS_MAX,
		.help = "Sessions (sockets) to spread each job's I/O over",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "poll",
		.lname = "netdam poll",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct netdam_fio_options, poll),
		/* The engine's default (src/settings.rs, docs/DECISIONS.md); fio passes it whenever
		 * poll= is not given, and shows it in --enghelp. */
		.def = "adaptive",
		.help = "How the job waits for completions: busy (spin), adaptive (spin while an answer is due soon, then sleep) or blocking (sleep)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "key",
		.lname = "netdam tenant key",
		.type = FIO_OPT_STR_STORE,
		.off1 = offsetof(struct netdam_fio_options, key),
		.help = "Tenant key file (netdam-target tenant create writes one); default $NETDAM_KEY, then the default tenant's key file",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "encrypt",
		.lname = "netdam encrypted sessions",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct netdam_fio_options, encrypt),
		.def = "0",
		.help = "Encrypt every datagram's instructions and data, both ways (needs a tenant key)",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = "coalesce",
		.lname = "netdam coalescing",
		.type = FIO_OPT_BOOL,
		.off1 = offsetof(struct netdam_fio_options, coalesce),
		.def = "1",
		.help = "While 8 or more other I/Os are outstanding, let a datagram with room wait (at most 20 us) for the next I/O to share it",
		.category = FIO_OPT_C_ENGINE,
		.group = FIO_OPT_G_INVALID,
	},
	{
		.name = NULL,
	},
};

/* Per fio thread: the Rust engine and the completions the last getevents reaped. */
struct netdam_fio_data {
	struct netdam_fio_engine *engine;
	/* iodepth entries: getevents never returns more than are in flight. */
	struct netdam_fio_completion *completions;
	unsigned int capacity;
};

/* Records a job error as td_verror() would (that helper is not exported by every fio build).
 * The message itself has been printed by the Rust half. Returns 1, fio's "failed". */
static int netdam_fail(struct thread_data *td, int error, const char *what)
{
	if (!td->error) {
		td->error = error;
		snprintf(td->verror, sizeof(td->verror), "netdam %s: %s", what, strerror(error));
	}
	return 1;
}

static struct netdam_fio_settings netdam_settings(struct thread_data *td)
{
	struct netdam_fio_options *o = td->eo;
	struct netdam_fio_settings settings = {
		.job = td->o.name,
		.target = o->target,
		.namespace_name = o->namespace_name,
		.region = o->region,
		.sessions = o->sessions,
		.poll = o->poll,
		.key = o->key,
		.encrypt = o->encrypt,
		.coalesce = o->coalesce,
		.fua = td->o.sync_io != 0,
	};

	return settings;
}

/* Block sizes and alignments that a namespace's block size does not divide would fail every I/O;
 * say so once, naming the option, instead. Only the directions the job does are checked (fio
 * keeps a block size for each, and a write job's read size is never used: its verify reads use
 * the write's), so the message names the job's own. */
static int netdam_check_block_sizes(struct thread_data *td, uint32_t block_bytes)
{
	static const char *const names[DDIR_RWDIR_CNT] = { "read", "write", "trim" };
	const int used[DDIR_RWDIR_CNT] = { !!td_read(td), !!td_write(td), !!td_trim(td) };
	struct netdam_fio_options *o = td->eo;
	int ddir;

	if (block_bytes <= 1)
		return 0;
	for (ddir = 0; ddir < DDIR_RWDIR_CNT; ddir++) {
		unsigned long long min_bs = td->o.min_bs[ddir], max_bs = td->o.max_bs[ddir];
		unsigned long long align = td->o.ba[ddir];

		if (!used[ddir])
			continue;
		if (min_bs % block_bytes == 0 && max_bs % block_bytes == 0 && align % block_bytes == 0)
			continue;
		fprintf(stderr,
			"netdam: namespace=%s: %s block size %llu-%llu (blockalign %llu) is not a multiple of "
			"the namespace's %u-byte block; set bs= (and blockalign=) to multiples of it\n",
			o->namespace_name, names[ddir], min_bs, max_bs, align, block_bytes);
		return netdam_fail(td, EINVAL, "bs");
	}
	return 0;
}

/* Before the job starts (in fio's parent process, when create_serialize is on): asks the target
 * for the namespace's or region's size, which is every file's size. */
static int netdam_setup(struct thread_data *td)
{
	struct netdam_fio_settings settings = netdam_settings(td);
	struct netdam_fio_space space;
	struct fio_file *f;
	unsigned int i;
	int error;

	/* Each fio file would be the whole namespace or region, so the files of one job would write
	 * over each other's blocks and verify would report it as corruption: one file per job (jobs
	 * split a space with numjobs= and offset_increment=). Checked before the target is asked. */
	if (td->files_index > 1) {
		fprintf(stderr,
			"netdam: job %s has %u files (nrfiles= or a filename= list): each would be the whole %s "
			"%s, so they would overwrite each other; use one file per job, and numjobs= with "
			"offset_increment= to split it\n",
			td->o.name, td->files_index, settings.region ? "region" : "namespace",
			settings.region ? settings.region :
			settings.namespace_name ? settings.namespace_name : "(none given)");
		return netdam_fail(td, EINVAL, "nrfiles");
	}
	error = netdam_fio_probe(&settings, &space);
	if (error)
		return netdam_fail(td, error, "setup");
	if (!td->files_index) {
		fprintf(stderr, "netdam: job %s has no file to run on (read_iolog replay is not supported)\n",
			td->o.name);
		return netdam_fail(td, EINVAL, "setup");
	}
	/* fio names a file after the job (or filename=); it is the whole namespace or region. */
	for_each_file(td, f, i)
		f->real_file_size = space.size_bytes;
	return netdam_check_block_sizes(td, space.block_bytes);
}

/* In the job's own process or thread: the sessions, driven from this thread. */
static int netdam_init(struct thread_data *td)
{
	struct netdam_fio_settings settings = netdam_settings(td);
	struct netdam_fio_data *data;
	unsigned int capacity = td->o.iodepth ? td->o.iodepth : 1;
	int error;

	data = calloc(1, sizeof(*data));
	if (data)
		data->completions = calloc(capacity, sizeof(*data->completions));
	if (!data || !data->completions) {
		free(data);
		fprintf(stderr, "netdam: job %s: out of memory for %u completions\n", td->o.name, capacity);
		return netdam_fail(td, ENOMEM, "init");
	}
	data->capacity = capacity;
	error = netdam_fio_open(&settings, capacity, &data->engine);
	if (error) {
		free(data->completions);
		free(data);
		return netdam_fail(td, error, "init");
	}
	td->io_ops_data = data;
	return 0;
}

static void netdam_cleanup(struct thread_data *td)
{
	struct netdam_fio_data *data = td->io_ops_data;

	if (!data)
		return;
	netdam_fio_close(data->engine);
	free(data->completions);
	free(data);
	td->io_ops_data = NULL;
}

static enum fio_q_status netdam_queue(struct thread_data *td, struct io_u *io_u)
{
	struct netdam_fio_data *data = td->io_ops_data;
	uint32_t kind;
	int error;

	fio_ro_check(td, io_u);

	switch (io_u->ddir) {
	case DDIR_READ:
		kind = NETDAM_FIO_READ;
		break;
	case DDIR_WRITE:
		kind = NETDAM_FIO_WRITE;
		break;
	case DDIR_SYNC:
	case DDIR_DATASYNC:
	case DDIR_SYNC_FILE_RANGE:
		kind = NETDAM_FIO_SYNC;
		break;
	case DDIR_TRIM:
		kind = NETDAM_FIO_TRIM;
		break;
	default:
		io_u->error = EINVAL;
		return FIO_Q_COMPLETED;
	}
	error = netdam_fio_submit(data->engine, kind, io_u->offset, io_u->xfer_buf, io_u->xfer_buflen, io_u);
	if (error) {
		io_u->error = error;
		return FIO_Q_COMPLETED;
	}
	return FIO_Q_QUEUED;
}

/* Sends the I/Os queued since the last commit. fio commits after every iodepth_batch_submit
 * queued I/Os (1 by default) and before it waits for completions, so a larger batch lets the
 * engine pack several I/Os into one datagram. */
static int netdam_commit(struct thread_data *td)
{
	struct netdam_fio_data *data = td->io_ops_data;

	netdam_fio_commit(data->engine);
	return 0;
}

static int netdam_getevents(struct thread_data *td, unsigned int min, unsigned int max, const struct timespec *t)
{
	struct netdam_fio_data *data = td->io_ops_data;
	int64_t timeout_ns = -1;
	uint32_t reaped, i;

	if (t)
		timeout_ns = (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec;
	if (max > data->capacity)
		max = data->capacity;
	reaped = netdam_fio_reap(data->engine, min, max, timeout_ns, data->completions);
	for (i = 0; i < reaped; i++) {
		struct io_u *io_u = data->completions[i].cookie;

		io_u->error = data->completions[i].error;
		/* A failed transfer moved no bytes that fio may count. */
		if (io_u->error)
			io_u->resid = io_u->xfer_buflen;
	}
	return (int)reaped;
}

static struct io_u *netdam_event(struct thread_data *td, int event)
{
	struct netdam_fio_data *data = td->io_ops_data;

	return data->completions[event].cookie;
}

/* The "file" is the namespace or region: there is nothing to open, close or invalidate. */
static int netdam_open_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static int netdam_close_file(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static int netdam_invalidate(struct thread_data *td, struct fio_file *f)
{
	return 0;
}

static struct ioengine_ops netdam_ioengine = {
	.name = "netdam",
	.version = FIO_IOOPS_VERSION,
	/* No local disk, no file to extend, no disk statistics to collect. */
	.flags = FIO_DISKLESSIO | FIO_NOEXTEND | FIO_NODISKUTIL,
	.setup = netdam_setup,
	.init = netdam_init,
	.cleanup = netdam_cleanup,
	.queue = netdam_queue,
	.commit = netdam_commit,
	.getevents = netdam_getevents,
	.event = netdam_event,
	.open_file = netdam_open_file,
	.close_file = netdam_close_file,
	.invalidate = netdam_invalidate,
	.options = options,
	.option_struct_size = sizeof(struct netdam_fio_options),
};

/* fio finds the table through get_ioengine(), which the Rust half exports (a Rust cdylib exports
 * only Rust symbols) and which calls this. */
void *netdam_fio_shim_ioengine(void);

void *netdam_fio_shim_ioengine(void)
{
	return &netdam_ioengine;
}
