/* Stand-in for src/aiori.h as of hpc/ior 5fcf0ba995fd (checked line by line): the backend interface as aiori-BENCHFS.c uses it, with
 * IOR's names, types and ior_aiori_t member order (see README.md). */
#ifndef _AIORI_H
#define _AIORI_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "iordef.h"
#include "aiori-debug.h"
#include "option.h"

#define IOR_RDONLY        0x01
#define IOR_WRONLY        0x02
#define IOR_RDWR          0x04
#define IOR_APPEND        0x08
#define IOR_CREAT         0x10
#define IOR_TRUNC         0x20
#define IOR_EXCL          0x40
#define IOR_DIRECT        0x80

typedef struct ior_aiori_statfs {
        uint64_t f_bsize;
        uint64_t f_blocks;
        uint64_t f_bfree;
        uint64_t f_bavail;
        uint64_t f_files;
        uint64_t f_ffree;
} ior_aiori_statfs_t;

typedef struct aiori_xfer_hint_t {
        int dryRun;
        int filePerProc;
        int collective;
        int numTasks;
        int numNodes;
        int randomOffset;
        int fsyncPerWrite;
        IOR_offset_t segmentCount;
        IOR_offset_t blockSize;
        IOR_offset_t transferSize;
        IOR_offset_t expectedAggFileSize;
        int singleXferAttempt;
} aiori_xfer_hint_t;

/* IOR's headers make aiori_mod_opt_t a name for this struct. */
typedef struct aiori_mod_opt_t aiori_mod_opt_t;
struct aiori_mod_opt_t {
        void *dummy;
};

typedef struct aiori_fd_t {
        void *dummy;
} aiori_fd_t;

typedef struct ior_aiori {
        char *name;
        char *name_legacy;
        aiori_fd_t *(*create)(char *, int iorflags, aiori_mod_opt_t *);
        int (*mknod)(char *);
        aiori_fd_t *(*open)(char *, int iorflags, aiori_mod_opt_t *);
        void (*xfer_hints)(aiori_xfer_hint_t *params);
        IOR_offset_t (*xfer)(int access, aiori_fd_t *, IOR_size_t *, IOR_offset_t size,
                             IOR_offset_t offset, aiori_mod_opt_t *module_options);
        void (*close)(aiori_fd_t *, aiori_mod_opt_t *module_options);
        void (*remove)(char *, aiori_mod_opt_t *module_options);
        char *(*get_version)(void);
        void (*fsync)(aiori_fd_t *, aiori_mod_opt_t *module_options);
        IOR_offset_t (*get_file_size)(aiori_mod_opt_t *module_options, char *filename);
        int (*statfs)(const char *, ior_aiori_statfs_t *, aiori_mod_opt_t *module_options);
        int (*mkdir)(const char *path, mode_t mode, aiori_mod_opt_t *module_options);
        int (*rmdir)(const char *path, aiori_mod_opt_t *module_options);
        int (*access)(const char *path, int mode, aiori_mod_opt_t *module_options);
        int (*stat)(const char *path, struct stat *buf, aiori_mod_opt_t *module_options);
        void (*initialize)(aiori_mod_opt_t *options);
        void (*finalize)(aiori_mod_opt_t *options);
        int (*rename)(const char *oldpath, const char *newpath, aiori_mod_opt_t *module_options);
        option_help *(*get_options)(aiori_mod_opt_t **init_backend_options,
                                    aiori_mod_opt_t *init_values);
        int (*check_params)(aiori_mod_opt_t *);
        void (*sync)(aiori_mod_opt_t *);
        bool enable_mdtest;
} ior_aiori_t;

extern ior_aiori_t benchfs_aiori;

#endif
