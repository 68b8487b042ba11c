/* precision_tool._native: the two loops that numpy makes too many passes for.
 *
 * - pair_sums: the fused pass of precision_tool.compare.metrics.PairAccumulator, and pairs_sums, the
 *   same for many small pairs at once;
 * - diff_norms: the diagnosis's relative error of a tensor pair;
 * - stats_rows: the statistics of many arrays at once, for precision_tool.dump.stats
 *   (the collector's statistics, every op of every step);
 * - slots: the collector's per-tensor bookkeeping of one op, statistics included;
 * - stats_at: stats_rows of one torch tensor where it lies, float16 and bfloat16 included;
 * - round16: simulate_npu's rounding into float16 / bfloat16 (see below);
 * - guard_*: a SIGBUS handler that keeps a dump cut short while mapped from ending the process (see below).
 *
 * The module is optional (setup.py): without a C compiler both callers take
 * their numpy paths, which compute the same float64 sums more slowly.
 *
 * ---- pair_sums ----
 *
 * One call reads a chunk of a tensor pair once and adds to float64 sums
 * everything the metrics need: Σxy, Σx², Σy², Σ(x−y)², Σ|x−y|, max|x−y|,
 * Σ|x−y|/|y|, max |x−y|/|y| and the count of |y| above the relative-error
 * floor, and KL's Σu, Σv and Σu·log(u/v) (see metrics.py for what u and v
 * are). numpy needs about thirty passes and 8 ns a pair for the same; this
 * loop vectorises to about 2 ns on AVX2.
 *
 * KL's log(u/v) is 2·atanh(s), s = (u−v)/(u+v), taken as five terms of the
 * atanh series where s² <= KL_SERIES_MAX_S2: the remainder is then below half
 * a float64 ulp of each term. The few other elements of a block take the log
 * in a second pass over the block while it is still in cache.
 *
 * The inputs must be finite. The build uses -ffinite-math-only (a vectorised
 * max needs it), so the loop cannot test for NaN or inf itself; instead the
 * bits of each block's Σx² and Σy² are checked after the block, and a chunk
 * holding a non-finite value adds nothing and returns 1: the caller then
 * screens the chunk and calls again.
 *
 * Every sum is float64, as in the numpy path; the compiler may split a sum
 * across vector lanes, which changes the rounding of the last bits only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifndef _WIN32
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#define BLOCK 4096                      /* elements per block: the second KL pass reads it from L1/L2 */
#define KL_SERIES_MAX_S2 (0.025 * 0.025) /* metrics.SERIES_MAX squared */

enum {  /* slots of the sums array; metrics.py names the same indices */
    S_COUNT, S_XY, S_XX, S_YY, S_DD, S_ABS, S_MAX_ABS, S_REL, S_MAX_REL, S_REL_COUNT,
    S_KL_U, S_KL_V, S_KL_S, N_SUMS
};

typedef struct {
    double x_lo, x_floor, y_lo, y_floor, rel_floor;
} params_t;

typedef struct {
    double xy, xx, yy, dd, abs, max_abs, rel, max_rel, kl_u, kl_v, kl_atanh;
    int64_t rel_count, outliers;
} block_t;

static int is_finite_bits(double value)
{
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);  /* the compiler may assume finite values, not finite bits */
    return ((bits >> 52) & 0x7ff) != 0x7ff;
}

/* The same loop for each pair of element types: float32 or float64 on either side. */
#define DEFINE_BLOCK(NAME, TX, TY)                                                                  \
    static void NAME(const TX *restrict x, const TY *restrict y, Py_ssize_t n,                     \
                     const params_t *p, block_t *out)                                             \
    {                                                                                               \
        double xy = 0, xx = 0, yy = 0, dd = 0, sabs = 0, max_abs = 0, rel = 0, max_rel = 0;        \
        double kl_u = 0, kl_v = 0, kl_atanh = 0;                                                    \
        int64_t rel_count = 0, outliers = 0;                                                        \
        const double x_lo = p->x_lo, x_floor = p->x_floor, y_lo = p->y_lo, y_floor = p->y_floor;   \
        const double rel_floor = p->rel_floor;                                                      \
        for (Py_ssize_t i = 0; i < n; i++) {                                                        \
            const double a = (double)x[i], b = (double)y[i], d = a - b;                             \
            xy += a * b; xx += a * a; yy += b * b; dd += d * d;                                     \
            const double ad = fabs(d), ab = fabs(b);                                                \
            sabs += ad; max_abs = ad > max_abs ? ad : max_abs;                                      \
            const int counted = ab > rel_floor;                                                     \
            const double r = counted ? ad / ab : 0.0;                                               \
            rel_count += counted; rel += r; max_rel = r > max_rel ? r : max_rel;                    \
            double u = a - x_lo, v = b - y_lo;                                                      \
            u = u > x_floor ? u : x_floor; v = v > y_floor ? v : y_floor;                           \
            kl_u += u; kl_v += v;                                                                   \
            const double s = (u - v) / (u + v), z = s * s;                                          \
            const int series = z <= KL_SERIES_MAX_S2;                                               \
            const double atanh = s * ((((z * (1.0 / 9) + 1.0 / 7) * z + 1.0 / 5) * z + 1.0 / 3) * z + 1.0); \
            kl_atanh += series ? u * atanh : 0.0;                                                   \
            outliers += !series;                                                                    \
        }                                                                                           \
        if (outliers) {                                                                             \
            for (Py_ssize_t i = 0; i < n; i++) {                                                    \
                double u = (double)x[i] - x_lo, v = (double)y[i] - y_lo;                            \
                u = u > x_floor ? u : x_floor; v = v > y_floor ? v : y_floor;                       \
                const double s = (u - v) / (u + v);                                                 \
                if (s * s > KL_SERIES_MAX_S2)                                                       \
                    kl_atanh += 0.5 * u * log(u / v);                                               \
            }                                                                                       \
        }                                                                                           \
        out->xy = xy; out->xx = xx; out->yy = yy; out->dd = dd; out->abs = sabs;                    \
        out->max_abs = max_abs; out->rel = rel; out->max_rel = max_rel; out->kl_u = kl_u;           \
        out->kl_v = kl_v; out->kl_atanh = kl_atanh; out->rel_count = rel_count;                     \
        out->outliers = outliers;                                                                   \
    }

/* An AVX2+FMA clone beside the baseline one, picked at load time (GCC on x86-64 Linux). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

CLONES DEFINE_BLOCK(block_ff, float, float)
CLONES DEFINE_BLOCK(block_fd, float, double)
CLONES DEFINE_BLOCK(block_df, double, float)
CLONES DEFINE_BLOCK(block_dd, double, double)

typedef void (*block_fn)(const void *, const void *, Py_ssize_t, const params_t *, block_t *);

/* 'f' or 'd' (native byte order) from a buffer format; 0 for anything else. */
static char element_kind(const Py_buffer *view)
{
    const char *format = view->format ? view->format : "B";
    if (format[0] == '@' || format[0] == '=' || (format[0] == '<' && PY_LITTLE_ENDIAN))
        format++;
    if (format[1] != '\0')
        return 0;
    if (format[0] == 'f' && view->itemsize == 4)
        return 'f';
    if (format[0] == 'd' && view->itemsize == 8)
        return 'd';
    return 0;
}

/* Element kinds of a stored tensor: the block loops read float32 or float64; float16 and bfloat16 (its
 * bits, as the dump stores it) are widened to float32 block by block first, exactly. */
enum { K_F32, K_F64, K_F16, K_BF16, N_KINDS };
static const Py_ssize_t kind_size[N_KINDS] = {4, 8, 2, 2};

static float bits_to_float(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* IEEE binary16 to binary32, exact, in integer arithmetic (no dependence on the FPU's denormal mode). */
static float f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f)
        return bits_to_float(sign | 0x7f800000u | (man << 13));
    if (exp)
        return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
    if (!man)
        return bits_to_float(sign);
    const int shift = __builtin_clz(man) - 21;  /* a subnormal: normalise so that bit 10 is set */
    man <<= shift;
    return bits_to_float(sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3ff) << 13));
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>
#define HAVE_F16C_PATH 1

/* Whether this CPU has the F16C conversions (and AVX, whose registers they use); asked once. */
static int has_f16c(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    }
    return known;
}
/* float16 to float32 eight at a time by the F16C instruction (exact, subnormals included; a signalling
 * NaN comes out quiet, which no caller can tell: NaN is only counted), the tail by f16_to_f32. */
__attribute__((target("avx,f16c"))) static void widen_f16c(const uint16_t *h, Py_ssize_t n, float *dst)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++)
        dst[i] = f16_to_f32(h[i]);
}
#endif

/* `n` stored values of kind K_F16 or K_BF16 at `src` as float32 at `dst`. */
static void widen(int kind, const char *src, Py_ssize_t n, float *dst)
{
    const uint16_t *h = (const uint16_t *)src;
    if (kind == K_BF16) {
        for (Py_ssize_t i = 0; i < n; i++)
            dst[i] = bits_to_float((uint32_t)h[i] << 16);
        return;
    }
#ifdef HAVE_F16C_PATH
    if (n >= 8 && has_f16c()) {
        widen_f16c(h, n, dst);
        return;
    }
#endif
    for (Py_ssize_t i = 0; i < n; i++)
        dst[i] = f16_to_f32(h[i]);
}

/* Add one chunk to the sums; 0 when done, 1 when a value is not finite (nothing added).
 * `x_kind`/`y_kind` K_F16 or K_BF16 widen each block to float32 first (then `fn` must read float32 there). */
static int accumulate_chunk_kinds(block_fn fn, const char *x, int x_kind, const char *y, int y_kind,
                                  Py_ssize_t n, const params_t *p, double *sums)
{
    double add[N_SUMS] = {0};
    double max_abs = sums[S_MAX_ABS], max_rel = sums[S_MAX_REL];
    double kl_atanh = 0.0;
    int64_t rel_count = 0;
    float x_wide[BLOCK], y_wide[BLOCK];
    const Py_ssize_t x_size = kind_size[x_kind], y_size = kind_size[y_kind];
    for (Py_ssize_t start = 0; start < n; start += BLOCK) {
        const Py_ssize_t m = n - start < BLOCK ? n - start : BLOCK;
        const void *xb = x + start * x_size, *yb = y + start * y_size;
        if (x_kind >= K_F16) {
            widen(x_kind, xb, m, x_wide);
            xb = x_wide;
        }
        if (y_kind >= K_F16) {
            widen(y_kind, yb, m, y_wide);
            yb = y_wide;
        }
        block_t b;
        fn(xb, yb, m, p, &b);
        if (!is_finite_bits(b.xx) || !is_finite_bits(b.yy))
            return 1;
        add[S_XY] += b.xy; add[S_XX] += b.xx; add[S_YY] += b.yy; add[S_DD] += b.dd;
        add[S_ABS] += b.abs; add[S_REL] += b.rel; add[S_KL_U] += b.kl_u; add[S_KL_V] += b.kl_v;
        kl_atanh += b.kl_atanh;
        rel_count += b.rel_count;
        max_abs = b.max_abs > max_abs ? b.max_abs : max_abs;
        max_rel = b.max_rel > max_rel ? b.max_rel : max_rel;
    }
    for (int k = S_XY; k < N_SUMS; k++)
        sums[k] += add[k];
    sums[S_COUNT] += (double)n;
    sums[S_MAX_ABS] = max_abs;
    sums[S_MAX_REL] = max_rel;
    sums[S_REL_COUNT] += (double)rel_count;
    sums[S_KL_S] += 2.0 * kl_atanh;
    return 0;
}

/* The block loop for a pair of kinds (float16 and bfloat16 read as the float32 they widen to). */
static block_fn block_for(int x_kind, int y_kind)
{
    const int xd = x_kind == K_F64, yd = y_kind == K_F64;
    return (block_fn)(xd ? (yd ? (void *)block_dd : (void *)block_df) : (yd ? (void *)block_fd : (void *)block_ff));
}

static int accumulate_chunk(block_fn fn, const char *x, Py_ssize_t x_size, const char *y, Py_ssize_t y_size,
                            Py_ssize_t n, const params_t *p, double *sums)
{
    return accumulate_chunk_kinds(fn, x, x_size == 8 ? K_F64 : K_F32, y, y_size == 8 ? K_F64 : K_F32, n, p, sums);
}

static PyObject *pair_sums(PyObject *module, PyObject *args)
{
    PyObject *x_obj, *y_obj, *sums_obj;
    params_t p;
    if (!PyArg_ParseTuple(args, "OOOddddd:pair_sums", &x_obj, &y_obj, &sums_obj,
                          &p.x_lo, &p.x_floor, &p.y_lo, &p.y_floor, &p.rel_floor))
        return NULL;
    Py_buffer x, y, sums;
    if (PyObject_GetBuffer(x_obj, &x, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(y_obj, &y, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    if (PyObject_GetBuffer(sums_obj, &sums, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&y);
        return NULL;
    }
    PyObject *result = NULL;
    const char xk = element_kind(&x), yk = element_kind(&y);
    const Py_ssize_t n = xk ? x.len / x.itemsize : 0;
    if (!xk || !yk || element_kind(&sums) != 'd') {
        PyErr_SetString(PyExc_TypeError, "pair_sums: x and y must be float32 or float64, sums float64");
    } else if (y.len / y.itemsize != n) {
        PyErr_SetString(PyExc_ValueError, "pair_sums: x and y differ in length");
    } else if (sums.len / (Py_ssize_t)sizeof(double) < N_SUMS) {
        PyErr_SetString(PyExc_ValueError, "pair_sums: sums is too short");
    } else {
        block_fn fn = (block_fn)(xk == 'f' ? (yk == 'f' ? (void *)block_ff : (void *)block_fd)
                                           : (yk == 'f' ? (void *)block_df : (void *)block_dd));
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = accumulate_chunk(fn, x.buf, x.itemsize, y.buf, y.itemsize, n, &p, sums.buf);
        Py_END_ALLOW_THREADS
        result = PyLong_FromLong(status);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    PyBuffer_Release(&sums);
    return result;
}

/* ---- pairs_sums ----
 *
 * The sums of many small tensor pairs in one call: the comparator's batch of
 * packed tensors (precision_tool.compare.batch). Each pair is a run of values
 * in one of a few byte buffers per side (a dump step's packs, mapped), given
 * by a row of `table`: x buffer, x byte offset, x kind, y buffer, y byte
 * offset, y kind, count. Each pair gets its own row of sums, computed exactly
 * as pair_sums computes them for the same values in one chunk, and a status:
 * 0 done, 1 a value is not finite (the caller redoes that pair its own way),
 * 2 the row points outside its buffer or is misaligned (likewise).
 */
enum { T_XBUF, T_XOFF, T_XKIND, T_YBUF, T_YOFF, T_YKIND, T_COUNT, T_COLUMNS };

static int get_buffers(PyObject *seq, Py_buffer **views, Py_ssize_t *n)
{
    *n = PyTuple_Size(seq);
    if (*n < 0)
        return -1;
    *views = PyMem_Calloc(*n ? *n : 1, sizeof(Py_buffer));
    if (!*views) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(seq, i), &(*views)[i], PyBUF_C_CONTIGUOUS) < 0) {
            for (Py_ssize_t j = 0; j < i; j++)
                PyBuffer_Release(&(*views)[j]);
            PyMem_Free(*views);
            *views = NULL;
            return -1;
        }
    }
    return 0;
}

static void release_buffers(Py_buffer *views, Py_ssize_t n)
{
    if (!views)
        return;
    for (Py_ssize_t i = 0; i < n; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
}

/* The start of a pair's values in its buffer, or NULL when the row does not fit it. */
static const char *pair_start(const Py_buffer *views, Py_ssize_t n_views, int64_t buf, int64_t offset, int64_t kind,
                              int64_t count)
{
    if (buf < 0 || buf >= n_views || kind < 0 || kind >= N_KINDS || offset < 0 || count < 0)
        return NULL;
    const Py_ssize_t size = kind_size[kind];
    if (offset % size || count > (views[buf].len - offset) / size)
        return NULL;
    return (const char *)views[buf].buf + offset;
}

static PyObject *pairs_sums(PyObject *module, PyObject *args)
{
    PyObject *x_seq, *y_seq, *table_obj, *params_obj, *sums_obj, *status_obj;
    if (!PyArg_ParseTuple(args, "O!O!OOOO:pairs_sums", &PyTuple_Type, &x_seq, &PyTuple_Type, &y_seq, &table_obj,
                          &params_obj, &sums_obj, &status_obj))
        return NULL;
    Py_buffer *xs = NULL, *ys = NULL;
    Py_ssize_t n_xs = 0, n_ys = 0;
    Py_buffer table = {0}, params = {0}, sums = {0}, status = {0};
    PyObject *result = NULL;
    if (get_buffers(x_seq, &xs, &n_xs) < 0 || get_buffers(y_seq, &ys, &n_ys) < 0)
        goto done;
    if (PyObject_GetBuffer(table_obj, &table, PyBUF_C_CONTIGUOUS) < 0
        || PyObject_GetBuffer(params_obj, &params, PyBUF_C_CONTIGUOUS) < 0
        || PyObject_GetBuffer(sums_obj, &sums, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0
        || PyObject_GetBuffer(status_obj, &status, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        goto done;
    const Py_ssize_t n = status.len;
    if (table.len != n * T_COLUMNS * (Py_ssize_t)sizeof(int64_t) || params.len != n * 5 * (Py_ssize_t)sizeof(double)
        || sums.len != n * N_SUMS * (Py_ssize_t)sizeof(double)) {
        PyErr_SetString(PyExc_ValueError, "pairs_sums: table (n x 7 int64), params (n x 5 float64), sums "
                                          "(n x N_SUMS float64) and status (n int8) disagree on n");
        goto done;
    }
    const int64_t *rows = table.buf;
    const double *par = params.buf;
    double *out = sums.buf;
    int8_t *st = status.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t *r = rows + i * T_COLUMNS;
        double *s = out + i * N_SUMS;
        memset(s, 0, N_SUMS * sizeof(double));
        const char *x = pair_start(xs, n_xs, r[T_XBUF], r[T_XOFF], r[T_XKIND], r[T_COUNT]);
        const char *y = pair_start(ys, n_ys, r[T_YBUF], r[T_YOFF], r[T_YKIND], r[T_COUNT]);
        if (!x || !y) {
            st[i] = 2;
            continue;
        }
        const params_t p = {par[i * 5], par[i * 5 + 1], par[i * 5 + 2], par[i * 5 + 3], par[i * 5 + 4]};
        st[i] = (int8_t)accumulate_chunk_kinds(block_for((int)r[T_XKIND], (int)r[T_YKIND]), x, (int)r[T_XKIND], y,
                                               (int)r[T_YKIND], (Py_ssize_t)r[T_COUNT], &p, s);
        if (st[i])
            memset(s, 0, N_SUMS * sizeof(double));
    }
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    release_buffers(xs, n_xs);
    release_buffers(ys, n_ys);
    if (table.obj) PyBuffer_Release(&table);
    if (params.obj) PyBuffer_Release(&params);
    if (sums.obj) PyBuffer_Release(&sums);
    if (status.obj) PyBuffer_Release(&status);
    return result;
}

/* ---- diff_norms ----
 *
 * Σ(x−y)² and Σy² of two finite arrays in one pass, float64 sums: the
 * diagnosis's relative error ||x − y|| / ||y|| (precision_tool.analysis.errors),
 * taken thousands of times per diagnosis on tensors of up to a million values.
 * numpy needs two float64 copies and two dots for it.
 */
#define DEFINE_DIFF(NAME, TX, TY)                                                                   \
    static void NAME(const TX *restrict x, const TY *restrict y, Py_ssize_t n, double *dd, double *yy) \
    {                                                                                               \
        double a = 0, b = 0;                                                                        \
        for (Py_ssize_t i = 0; i < n; i++) {                                                        \
            const double v = (double)y[i], d = (double)x[i] - v;                                    \
            a += d * d;                                                                             \
            b += v * v;                                                                             \
        }                                                                                           \
        *dd = a;                                                                                    \
        *yy = b;                                                                                    \
    }

CLONES DEFINE_DIFF(diff_ff, float, float)
CLONES DEFINE_DIFF(diff_fd, float, double)
CLONES DEFINE_DIFF(diff_df, double, float)
CLONES DEFINE_DIFF(diff_dd, double, double)

static PyObject *diff_norms(PyObject *module, PyObject *args)
{
    PyObject *x_obj, *y_obj;
    if (!PyArg_ParseTuple(args, "OO:diff_norms", &x_obj, &y_obj))
        return NULL;
    Py_buffer x, y;
    if (PyObject_GetBuffer(x_obj, &x, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(y_obj, &y, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    PyObject *result = NULL;
    const char xk = element_kind(&x), yk = element_kind(&y);
    const Py_ssize_t n = xk ? x.len / x.itemsize : 0;
    if (!xk || !yk) {
        PyErr_SetString(PyExc_TypeError, "diff_norms: x and y must be float32 or float64");
    } else if (y.len / y.itemsize != n) {
        PyErr_SetString(PyExc_ValueError, "diff_norms: x and y differ in length");
    } else {
        double dd = 0, yy = 0;
        Py_BEGIN_ALLOW_THREADS
        if (xk == 'f')
            (yk == 'f' ? diff_ff((const float *)x.buf, (const float *)y.buf, n, &dd, &yy)
                       : diff_fd((const float *)x.buf, (const double *)y.buf, n, &dd, &yy));
        else
            (yk == 'f' ? diff_df((const double *)x.buf, (const float *)y.buf, n, &dd, &yy)
                       : diff_dd((const double *)x.buf, (const double *)y.buf, n, &dd, &yy));
        Py_END_ALLOW_THREADS
        result = Py_BuildValue("dd", dd, yy);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&y);
    return result;
}

/* ---- stats_rows ----
 *
 * The statistics of many arrays, for precision_tool.dump.stats: for each
 * array, Σx, Σx², min and max in float64 in one pass, without copying it to
 * float64 (float32 values and their squares are exact in float64), and from
 * them the row (count, min, max, mean, std, L2 norm, 0, 0, 0) of
 * stats.stats_tuple, built here to spare numpy's per-call cost on a few
 * hundred small arrays a step. A constant array gets its value as mean and
 * std 0 exactly. An array gets None instead, for the caller to compute its
 * own way, when its sums are not finite (it holds NaN or inf, which the loop
 * may not test for: see pair_sums) or when its variance is below
 * `cancellation` times its mean squared, where Σx²/n − mean² has lost its
 * digits.
 */

#define DEFINE_MOMENTS(NAME, T)                                                                     \
    static void NAME(const T *restrict x, Py_ssize_t n, double *out)                               \
    {                                                                                               \
        double sum = 0, squares = 0, low = (double)x[0], high = (double)x[0];                      \
        for (Py_ssize_t i = 0; i < n; i++) {                                                        \
            const double v = (double)x[i];                                                          \
            sum += v; squares += v * v;                                                             \
            low = v < low ? v : low; high = v > high ? v : high;                                    \
        }                                                                                           \
        out[0] = sum; out[1] = squares; out[2] = low; out[3] = high;                                \
    }

CLONES DEFINE_MOMENTS(moments_f, float)
CLONES DEFINE_MOMENTS(moments_d, double)

/* The moments of `n` values of element kind 'f' or 'd' at `buf`; large arrays let other threads run meanwhile. */
static void moments(char kind, const void *buf, Py_ssize_t n, double *m)
{
    if (n < 16384) {  /* a few microseconds: not worth releasing the GIL for */
        (kind == 'f' ? moments_f((const float *)buf, n, m) : moments_d((const double *)buf, n, m));
    } else {
        Py_BEGIN_ALLOW_THREADS
        (kind == 'f' ? moments_f((const float *)buf, n, m) : moments_d((const double *)buf, n, m));
        Py_END_ALLOW_THREADS
    }
}

/* The stats row of one array from its moments; a new reference to None where the caller must redo it. */
static PyObject *stats_row(Py_ssize_t n, const double *m, double cancellation)
{
    const double sum = m[0], squares = m[1], low = m[2], high = m[3];
    if (!is_finite_bits(sum) || !is_finite_bits(squares))
        return Py_NewRef(Py_None);
    double mean = sum / (double)n, variance = squares / (double)n - mean * mean;
    if (low == high) {
        mean = low;
        variance = 0.0;
    } else if (variance < cancellation * mean * mean) {
        return Py_NewRef(Py_None);
    }
    /* built item by item: Py_BuildValue parses its format on every call, a few hundred a step */
    const double values[5] = {low, high, mean, sqrt(variance > 0.0 ? variance : 0.0), sqrt(squares)};
    PyObject *row = PyTuple_New(9);
    if (!row)
        return NULL;
    PyObject *item = PyLong_FromSsize_t(n);
    if (!item)
        goto fail;
    PyTuple_SET_ITEM(row, 0, item);
    for (int k = 0; k < 5; k++) {
        if (!(item = PyFloat_FromDouble(values[k])))
            goto fail;
        PyTuple_SET_ITEM(row, 1 + k, item);
    }
    for (int k = 6; k < 9; k++) {
        if (!(item = PyLong_FromLong(0)))
            goto fail;
        PyTuple_SET_ITEM(row, k, item);
    }
    return row;
fail:
    Py_DECREF(row);  /* items not set yet are NULL, which tuple deallocation skips */
    return NULL;
}

static PyObject *stats_rows(PyObject *module, PyObject *args)
{
    PyObject *arrays;
    double cancellation;
    if (!PyArg_ParseTuple(args, "Od:stats_rows", &arrays, &cancellation))
        return NULL;
    PyObject *seq = PySequence_Fast(arrays, "stats_rows: arrays must be a sequence");
    if (!seq)
        return NULL;
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject *rows = PyList_New(count);
    for (Py_ssize_t k = 0; rows && k < count; k++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, k), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            Py_CLEAR(rows);
            break;
        }
        const char kind = element_kind(&view);
        const Py_ssize_t n = kind ? view.len / view.itemsize : 0;
        if (!kind || n == 0) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "stats_rows: arrays must be non-empty float32 or float64");
            Py_CLEAR(rows);
            break;
        }
        double m[4];
        moments(kind, view.buf, n, m);
        PyBuffer_Release(&view);
        PyObject *row = stats_row(n, m, cancellation);
        if (!row) {
            Py_CLEAR(rows);
            break;
        }
        PyList_SET_ITEM(rows, k, row);
    }
    Py_DECREF(seq);
    return rows;
}

/* ---- stats_at ----
 *
 * stats_rows for one tensor given by its address (a torch tensor's data
 * pointer: `n` contiguous values in CPU memory the caller keeps alive), of
 * kind K_F32, K_F64, K_F16 or K_BF16. float16 and bfloat16 are widened
 * exactly into a float32 buffer first and then summed by the very loop
 * stats_rows runs on float32 (the compiler may split its sums across vector
 * lanes, and a loop reading 16-bit values would split them otherwise): the
 * row is the same to the bit as stats_rows over the tensor's values as
 * float32. The row carries the count of values at or beyond `limit` in
 * magnitude (the format's largest finite value; none counted when
 * limit <= 0), as stats._saturated counts them.
 */

/* ---- small_stats_at ----
 *
 * stats._small_stats in C, for a tensor of at most SMALL_MAX values: the
 * same row to the bit. Python computes it with math.fsum (Shewchuk's exact
 * partials, rounded once, half-even across partials); exact_sum below is
 * CPython's loop for finite summands, and the squared deviations are taken
 * by the C library's pow(d, 2.0), as Python's ``d ** 2`` takes them (called
 * through a volatile pointer: the compiler would otherwise fold it to d * d,
 * which pow need not equal in the last bit). The block is compiled with
 * strict IEEE semantics: the file's -fassociative-math would let the compiler
 * cancel the error terms exact_sum depends on. A value that is not finite,
 * or a partial sum that overflows, gives None: the caller's path handles it.
 */

#define SMALL_MAX 64
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-associative-math", "no-finite-math-only", "signed-zeros", "no-fast-math")
#endif

static double (*volatile small_pow)(double, double) = pow;

/* math.fsum of n finite doubles; 0 on an intermediate overflow. */
static int exact_sum(const double *x, Py_ssize_t n, double *out)
{
    double p[SMALL_MAX + 1];
    Py_ssize_t m = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        double v = x[k];
        Py_ssize_t i = 0;
        for (Py_ssize_t j = 0; j < m; j++) {
            double y = p[j];
            if (fabs(v) < fabs(y)) {
                const double t = v;
                v = y;
                y = t;
            }
            const double hi = v + y;
            const double lo = y - (hi - v);
            if (lo != 0.0)
                p[i++] = lo;
            v = hi;
        }
        m = i;
        if (v != 0.0) {
            if (!is_finite_bits(v))
                return 0;
            p[m++] = v;
        }
    }
    double hi = 0.0, lo = 0.0;
    if (m > 0) {
        hi = p[--m];
        while (m > 0) {
            const double v = hi, y = p[--m];
            hi = v + y;
            lo = y - (hi - v);
            if (lo != 0.0)
                break;
        }
        if (m > 0 && ((lo < 0.0 && p[m - 1] < 0.0) || (lo > 0.0 && p[m - 1] > 0.0))) {
            const double y = lo * 2.0, v = hi + y;
            if (y == v - hi)
                hi = v;
        }
    }
    *out = hi;
    return 1;
}

static PyObject *small_stats_at(const void *buf, Py_ssize_t n, int kind, double limit)
{
    double x[SMALL_MAX], work[SMALL_MAX] = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        switch (kind) {
        case K_F32: x[i] = ((const float *)buf)[i]; break;
        case K_F64: x[i] = ((const double *)buf)[i]; break;
        case K_F16: x[i] = f16_to_f32(((const uint16_t *)buf)[i]); break;
        default: x[i] = bits_to_float((uint32_t)((const uint16_t *)buf)[i] << 16); break;
        }
        if (!is_finite_bits(x[i]))
            return Py_NewRef(Py_None);
    }
    double running = 0.0, total, squares, spread;  /* Python first tests that sum(values) is finite */
    for (Py_ssize_t i = 0; i < n; i++)
        running += x[i];
    if (!is_finite_bits(running) || !exact_sum(x, n, &total))
        return Py_NewRef(Py_None);
    double low = x[0], high = x[0];
    for (Py_ssize_t i = 1; i < n; i++) {  /* min() and max(): the first of equal values stays */
        if (x[i] < low)
            low = x[i];
        if (x[i] > high)
            high = x[i];
    }
    for (Py_ssize_t i = 0; i < n; i++)
        work[i] = x[i] * x[i];
    if (!exact_sum(work, n, &squares))
        return Py_NewRef(Py_None);
    const double mean = total / (double)n;
    for (Py_ssize_t i = 0; i < n; i++)
        work[i] = small_pow(x[i] - mean, 2.0);
    if (!exact_sum(work, n, &spread))
        return Py_NewRef(Py_None);
    Py_ssize_t saturated = 0;
    if (limit > 0.0 && (high >= limit || -low >= limit))
        for (Py_ssize_t i = 0; i < n; i++)
            saturated += fabs(x[i]) >= limit;
    const double variance = spread / (double)n;
    return Py_BuildValue("(nddddd iin)", n, low, high, mean, sqrt(variance), sqrt(squares), 0, 0, saturated);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* The n values of a row-strided layout (rows of `cols` contiguous values, `stride` values apart) gathered in
 * row order, as numpy's reshape(-1) of the strided array copies them: a new buffer of the same kind, or NULL. */
static void *gather_rows(const char *src, Py_ssize_t n, int kind, Py_ssize_t cols, Py_ssize_t stride)
{
    const size_t size = (size_t)kind_size[kind], row = (size_t)cols * size;
    char *dst = PyMem_RawMalloc((size_t)n * size);
    if (!dst)
        return NULL;
    for (Py_ssize_t r = 0, rows = n / cols; r < rows; r++)
        memcpy(dst + (size_t)r * row, src + (size_t)r * (size_t)stride * size, row);
    return dst;
}

static PyObject *stats_at(PyObject *module, PyObject *args)
{
    unsigned long long address;
    Py_ssize_t n, small = 0, cols = 0, stride = 0;
    int kind;
    double cancellation, limit;
    if (!PyArg_ParseTuple(args, "Knidd|nnn:stats_at", &address, &n, &kind, &cancellation, &limit, &small, &cols,
                          &stride))
        return NULL;
    if (kind < 0 || kind >= N_KINDS || n <= 0 || !address || cols < 0 || (cols && (n % cols || stride < cols))) {
        PyErr_SetString(PyExc_ValueError, "stats_at: bad kind, length, layout or address");
        return NULL;
    }
    const void *buf = (const void *)(uintptr_t)address;
    void *gathered = NULL;
    if (cols && stride != cols && n > cols) {
        if ((size_t)n > PY_SSIZE_T_MAX / 8 || !(gathered = gather_rows(buf, n, kind, cols, stride)))
            return PyErr_NoMemory();
        buf = gathered;
    }
    if (n <= small && n <= SMALL_MAX) {
        PyObject *row = small_stats_at(buf, n, kind, limit);
        PyMem_RawFree(gathered);
        return row;
    }
    float *wide = NULL;
    if (kind == K_F16 || kind == K_BF16) {
        if ((size_t)n > PY_SSIZE_T_MAX / sizeof(float) || !(wide = PyMem_RawMalloc((size_t)n * sizeof(float)))) {
            PyMem_RawFree(gathered);
            return PyErr_NoMemory();
        }
        widen(kind, (const char *)buf, n, wide);
        buf = wide;
        kind = K_F32;
    }
    double m[4];
    moments(kind == K_F32 ? 'f' : 'd', buf, n, m);
    PyObject *row = stats_row(n, m, cancellation);
    if (row && row != Py_None && limit > 0.0 && (m[3] >= limit || -m[2] >= limit)) {
        Py_ssize_t saturated = 0;
        if (kind == K_F32)
            for (Py_ssize_t i = 0; i < n; i++)
                saturated += fabs((double)((const float *)buf)[i]) >= limit;
        else
            for (Py_ssize_t i = 0; i < n; i++)
                saturated += fabs(((const double *)buf)[i]) >= limit;
        PyObject *count = PyLong_FromSsize_t(saturated);
        if (!count) {
            Py_CLEAR(row);
        } else {
            Py_DECREF(PyTuple_GET_ITEM(row, 8));
            PyTuple_SET_ITEM(row, 8, count);
        }
    }
    PyMem_RawFree(wide);
    PyMem_RawFree(gathered);
    return row;
}

/* ---- slots ----
 *
 * The collector's bookkeeping of one op's tensors in stats mode
 * (precision_tool.collect.collector._slots): for the inputs (kind 0) and
 * then the outputs (kind 1), (kind, i, dtype, shape, row) is appended to
 * `tensors` for each array, where `row` is the position in `rows` of the
 * statistics of the memory the array shows. A row is found in `seen`
 * (id(owner) -> (weak reference to owner, row)) while the reference still
 * points at the owner; else it is computed here, while the values are
 * still in cache, appended to `rows` and filed in `seen`. A row the caller
 * must finish (None: NaN, inf or cancellation; or a min or max at or beyond
 * `floor`, where some format's values saturate) is listed in `later` as
 * (row, owner).
 *
 * The owner of an array is the array itself when it owns its memory (`base`
 * is None), or its base when the array is a reshape, transpose or permute of
 * all of it (same start, same bytes, same element format): statistics do not
 * depend on the order of the values. An array the pass does not take (not
 * exactly `ndarray`, a dtype name not in `floats`, another kind of view, or
 * new to the step and not float32/float64, C-contiguous and non-empty) gets
 * None in `tensors` and (position in tensors, kind, i) in `leftover`, for
 * the caller to fill in its own way. This is precision_tool.collect.
 * collector._slot in C, about ten times faster per tensor.
 */

static PyObject *str_base, *str_shape;

static PyObject *weak_target(PyObject *ref)  /* new reference, or NULL (no exception) when dead */
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target = NULL;
    if (PyWeakref_GetRef(ref, &target) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return target;
#else
    PyObject *target = PyWeakref_GetObject(ref);
    if (target == NULL || target == Py_None) {
        PyErr_Clear();
        return NULL;
    }
    return Py_NewRef(target);
#endif
}

/* Whether a strided buffer's elements fill its len bytes from its start, in some order of the axes. */
static int covers_contiguously(const Py_buffer *view)
{
    if (view->ndim > 64 || (view->ndim > 0 && (!view->shape || !view->strides)))
        return 0;
    int order[64], n = 0;
    for (int d = 0; d < view->ndim; d++) {
        if (view->shape[d] == 1)
            continue;
        int k = n++;  /* insertion sort, largest stride first */
        while (k > 0 && view->strides[order[k - 1]] < view->strides[d]) {
            order[k] = order[k - 1];
            k--;
        }
        order[k] = d;
    }
    Py_ssize_t expected = view->itemsize;
    for (int k = n - 1; k >= 0; k--) {
        if (view->strides[order[k]] != expected)
            return 0;
        expected *= view->shape[order[k]];
    }
    return expected == view->len;
}

/* The owner of `array` (a new reference): 1, 0 when the pass does not take it, -1 on error. */
static int owner_of(PyObject *array, PyObject *ndarray, PyObject **owner)
{
    PyObject *base = PyObject_GetAttr(array, str_base);
    if (!base)
        return -1;
    if (base == Py_None) {
        Py_DECREF(base);
        *owner = Py_NewRef(array);
        return 1;
    }
    int taken = 0;
    PyObject *base_base = (PyObject *)Py_TYPE(base) == ndarray ? PyObject_GetAttr(base, str_base) : NULL;
    if (base_base == Py_None) {
        Py_buffer view, whole;
        if (PyObject_GetBuffer(array, &view, PyBUF_STRIDES | PyBUF_FORMAT) == 0) {
            if (PyObject_GetBuffer(base, &whole, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
                taken = view.buf == whole.buf && view.len == whole.len && view.itemsize == whole.itemsize
                        && view.format && whole.format && strcmp(view.format, whole.format) == 0
                        && covers_contiguously(&view);
                PyBuffer_Release(&whole);
            }
            PyBuffer_Release(&view);
        }
        PyErr_Clear();  /* a buffer refused: not taken */
    } else if (!base_base && PyErr_Occurred()) {
        Py_DECREF(base);
        return -1;
    }
    Py_XDECREF(base_base);
    if (!taken) {
        Py_DECREF(base);
        return 0;
    }
    *owner = base;
    return 1;
}

/* The row of `owner` already in `seen`, or -1 (-2 on error). */
static Py_ssize_t seen_row(PyObject *seen, PyObject *key, PyObject *owner)
{
    PyObject *entry = PyDict_GetItemWithError(seen, key);  /* borrowed */
    if (entry == NULL)
        return PyErr_Occurred() ? -2 : -1;
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2)
        return -1;
    PyObject *target = weak_target(PyTuple_GET_ITEM(entry, 0));
    Py_XDECREF(target);
    if (target != owner)
        return -1;
    Py_ssize_t row = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 1));
    return row < 0 && PyErr_Occurred() ? -2 : row;
}

/* Compute the statistics of `owner` into `rows` and file them in `seen`; the row, -1 if not taken, -2 on error. */
static Py_ssize_t new_row(PyObject *owner, PyObject *key, PyObject *seen, PyObject *rows, PyObject *later,
                          double cancellation, double floor)
{
    Py_buffer view;
    if (PyObject_GetBuffer(owner, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return -1;
    }
    const char kind = element_kind(&view);
    const Py_ssize_t n = kind ? view.len / view.itemsize : 0;
    if (n == 0) {
        PyBuffer_Release(&view);
        return -1;
    }
    double m[4];
    moments(kind, view.buf, n, m);
    PyBuffer_Release(&view);
    PyObject *row = stats_row(n, m, cancellation);
    if (!row)
        return -2;
    const Py_ssize_t position = PyList_GET_SIZE(rows);
    int failed = PyList_Append(rows, row) < 0;
    if (!failed && (row == Py_None || m[3] >= floor || -m[2] >= floor)) {
        PyObject *pair = Py_BuildValue("(nO)", position, owner);
        failed = !pair || PyList_Append(later, pair) < 0;
        Py_XDECREF(pair);
    }
    Py_DECREF(row);
    PyObject *ref = failed ? NULL : PyWeakref_NewRef(owner, NULL);
    PyObject *at = ref ? PyLong_FromSsize_t(position) : NULL;
    PyObject *entry = at ? PyTuple_Pack(2, ref, at) : NULL;
    failed = !entry || PyDict_SetItem(seen, key, entry) < 0;
    Py_XDECREF(ref);
    Py_XDECREF(at);
    Py_XDECREF(entry);
    return failed ? -2 : position;
}

typedef struct {
    PyObject *floats, *ndarray, *seen, *tensors, *rows, *later, *leftover;
    double cancellation, floor;
} slots_t;

/* One array: 1 when recorded, 0 when left to the caller, -1 on error. */
static int take(const slots_t *c, PyObject *kind, Py_ssize_t i, PyObject *array, PyObject *dtypes)
{
    if ((PyObject *)Py_TYPE(array) != c->ndarray || i >= PyList_GET_SIZE(dtypes))
        return 0;
    PyObject *dtype = PyList_GET_ITEM(dtypes, i);
    const int known = PySet_Contains(c->floats, dtype);
    if (known <= 0)
        return known;
    PyObject *owner = NULL;
    const int found = owner_of(array, c->ndarray, &owner);
    if (found <= 0)
        return found;
    Py_INCREF(dtype);  /* borrowed from the caller's list, which a finalizer run by the allocator could change */
    PyObject *key = PyLong_FromVoidPtr(owner);  /* id(owner) */
    Py_ssize_t row = key ? seen_row(c->seen, key, owner) : -2;
    if (row == -1)
        row = new_row(owner, key, c->seen, c->rows, c->later, c->cancellation, c->floor);
    Py_XDECREF(key);
    Py_DECREF(owner);
    PyObject *shape = row >= 0 ? PyObject_GetAttr(array, str_shape) : NULL;
    PyObject *index = shape ? PyLong_FromSsize_t(i) : NULL;
    PyObject *at = index ? PyLong_FromSsize_t(row) : NULL;
    PyObject *tensor = at ? PyTuple_Pack(5, kind, index, dtype, shape, at) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(index);
    Py_XDECREF(at);
    Py_DECREF(dtype);
    if (row < 0)
        return row == -1 ? 0 : -1;
    const int failed = !tensor || PyList_Append(c->tensors, tensor) < 0;
    Py_XDECREF(tensor);
    return failed ? -1 : 1;
}

static PyObject *slots(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "slots: inputs, input_dtypes, outputs, output_dtypes, floats, ndarray, "
                                         "seen, tensors, rows, later, leftover, cancellation, floor");
        return NULL;
    }
    slots_t c = {args[4], args[5], args[6], args[7], args[8], args[9], args[10],
                 PyFloat_AsDouble(args[11]), PyFloat_AsDouble(args[12])};
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) || !PyList_Check(args[3])
            || !PyAnySet_Check(c.floats) || !PyType_Check(c.ndarray) || !PyDict_Check(c.seen)
            || !PyList_Check(c.tensors) || !PyList_Check(c.rows) || !PyList_Check(c.later)
            || !PyList_Check(c.leftover)) {
        PyErr_SetString(PyExc_TypeError, "slots: wrong argument types");
        return NULL;
    }
    for (long k = 0; k < 2; k++) {
        PyObject *arrays = args[2 * k], *dtypes = args[2 * k + 1];
        PyObject *kind = PyLong_FromLong(k);
        if (!kind)
            return NULL;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(arrays); i++) {
            PyObject *array = PyList_GET_ITEM(arrays, i);
            if (array == Py_None)
                continue;
            Py_INCREF(array);  /* the lists are the caller's: keep the item while Python code may run */
            int taken = take(&c, kind, i, array, dtypes);
            Py_DECREF(array);
            if (taken == 0) {
                PyObject *at = Py_BuildValue("(nOn)", PyList_GET_SIZE(c.tensors), kind, i);
                taken = at && PyList_Append(c.leftover, at) == 0 && PyList_Append(c.tensors, Py_None) == 0 ? 1 : -1;
                Py_XDECREF(at);
            }
            if (taken < 0) {
                Py_DECREF(kind);
                return NULL;
            }
        }
        Py_DECREF(kind);
    }
    Py_RETURN_NONE;
}


/* ---- round16: simulate_npu's rounding of a float32 tensor into float16 / bfloat16 ----
 *
 * precision_tool.torch.tensors rounds every simulated op's float32 outputs (and
 * its inputs, when the op computes in a 16-bit format) with Format.round; on the
 * small tensors of a training step numpy's per-call cost dominates. This is the
 * same rounding on the tensor's memory (its data_ptr): round-to-nearest-even on
 * the bits, integer operations only (the fast-math flags of this build cannot
 * touch them), so the result is bit for bit Format.round's, which rounds the
 * same way (checked in tests/torch against Format.round on a stride of all 2**32
 * float32 patterns). Only the in-range case is handled: when some |x| reaches the
 * format's overflow threshold, or is NaN, nothing is written and the call returns
 * False, and the caller takes Format.round, which applies the overflow mode.
 * kind 0: float16, 1: bfloat16, 2: float32 (no rounding: only the range check).
 */
static inline uint32_t round_f16_bits(uint32_t u)
{
    const uint32_t sign = u & 0x80000000u, a = u & 0x7FFFFFFFu, e = a >> 23;
    /* a float16 normal (e >= 113): keep 10 of the 23 mantissa bits */
    const uint32_t normal = (a + 0xFFFu + ((a >> 13) & 1u)) & ~0x1FFFu;
    /* else the value m * 2**(e - 150) onto float16's subnormal grid, 2**-24: q = m / 2**shift rounded to
     * nearest even (shift >= 14; from 25 on q is 0, and 31 keeps the shifts defined), then q * 2**-24, an
     * exact conversion and an exact scaling. Both results are computed and one is kept: no branch, so the
     * loop vectorises (the old branchy form, checked equal on every in-range float32, took 2.3 ns a value) */
    uint32_t shift = 126u - e;
    shift = shift > 31u ? 31u : shift;
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u, q = m >> shift, rem = m & ((1u << shift) - 1u),
                   half = 1u << (shift - 1u), up = (rem > half) | ((rem == half) & q);  /* bit 0: round up */
    const float grid = (float)(int32_t)(q + (up & 1u)) * 0x1p-24f;  /* (GCC vectorises this form, not all) */
    uint32_t subnormal;
    memcpy(&subnormal, &grid, sizeof subnormal);
    return sign | (e >= 113u ? normal : subnormal);
}

CLONES static uint32_t max_magnitude_bits(const uint32_t *restrict src, Py_ssize_t n)
{
    uint32_t worst = 0;
    for (Py_ssize_t i = 0; i < n; i++) {             /* |x| bits order like |x|, NaNs above inf */
        const uint32_t a = src[i] & 0x7FFFFFFFu;
        worst = a > worst ? a : worst;
    }
    return worst;
}

/* in place, or from src into a distinct dst: either way the compiler knows nothing aliases, and vectorises */
CLONES static void round_f16_in_place(uint32_t *x, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        x[i] = round_f16_bits(x[i]);
}

CLONES static void round_f16_copy(const uint32_t *restrict src, uint32_t *restrict dst, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        dst[i] = round_f16_bits(src[i]);
}

#ifdef HAVE_F16C_PATH
/* round_f16_bits eight values at a time by the F16C instructions: float32 to float16 rounding to nearest
 * even (the immediate 0; subnormal results exact) and back, exactly. Only for values in float16's range,
 * as round16 checks first: no NaN, inf or overflow reaches it. Equal to round_f16_bits on every such
 * float32 (tests/torch/test_tensors.py checks them all). In place or not. */
__attribute__((target("avx,f16c"))) static void round_f16_f16c(const uint32_t *src, uint32_t *dst, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps((const float *)(src + i)), 0);
        _mm256_storeu_ps((float *)(dst + i), _mm256_cvtph_ps(half));
    }
    for (; i < n; i++)
        dst[i] = round_f16_bits(src[i]);
}
#endif

CLONES static void round_bf16_loop(const uint32_t *src, uint32_t *dst, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint32_t u = src[i];
        dst[i] = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    }
}

static const uint32_t round16_limits[3] = {0x477FF000u, 0x7F7F8000u, 0x7F800000u};

/* Round n in-range float32 values at src into format `kind` at dst (may equal src). */
static void round_span(const uint32_t *src, uint32_t *dst, Py_ssize_t n, int kind)
{
#ifdef HAVE_F16C_PATH
    if (kind == 0 && has_f16c())
        round_f16_f16c(src, dst, n);
    else
#endif
    if (kind == 0 && dst == src)
        round_f16_in_place(dst, n);
    else if (kind == 0)
        round_f16_copy(src, dst, n);
    else if (kind == 1)
        round_bf16_loop(src, dst, n);
    else if (dst != src)
        memcpy(dst, src, (size_t)n * 4u);
}

static PyObject *round16(PyObject *module, PyObject *args)
{
    unsigned long long src_address, dst_address;
    Py_ssize_t n, cols = 0, src_stride = 0, dst_stride = 0;
    int kind;
    if (!PyArg_ParseTuple(args, "KKni|nnn", &src_address, &dst_address, &n, &kind, &cols, &src_stride, &dst_stride))
        return NULL;
    if (kind < 0 || kind > 2 || n < 0 || cols < 0 || (cols && (n % cols || src_stride < cols || dst_stride < cols))) {
        PyErr_SetString(PyExc_ValueError, "round16: bad kind, length or layout");
        return NULL;
    }
    const uint32_t *src = (const uint32_t *)(uintptr_t)src_address;
    uint32_t *dst = (uint32_t *)(uintptr_t)dst_address;
    int in_range = 1;
    Py_BEGIN_ALLOW_THREADS  /* (the caller holds the tensors) */
    if (!cols) {
        in_range = max_magnitude_bits(src, n) < round16_limits[kind];
        if (in_range)
            round_span(src, dst, n, kind);
    } else {  /* rows of cols values, src_stride and dst_stride values apart: all checked before any is written */
        const Py_ssize_t rows = n / cols;
        for (Py_ssize_t r = 0; r < rows && in_range; r++)
            in_range = max_magnitude_bits(src + r * src_stride, cols) < round16_limits[kind];
        for (Py_ssize_t r = 0; r < rows && in_range; r++)
            round_span(src + r * src_stride, dst + r * dst_stride, cols, kind);
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(in_range);
}

/* ---- the mapping guard ----
 *
 * A dump's bytes are read where they lie, through read-only mappings of the file (precision_tool.dump.mapping).
 * A file cut short after it was mapped (truncated, or rewritten in place by `cp`) makes the next read of a page
 * past its new end a SIGBUS: the process dies with no Python exception. guard_install sets a SIGBUS handler;
 * guard_add registers a mapping. On a SIGBUS past the end of a file (BUS_ADRERR) at an address inside a
 * registered mapping, the handler maps zeros over the rest of that mapping, from the faulting page on, marks
 * the mapping as faulted and returns: the read completes (reading zeros), and the reader, asking
 * guard_faulted, raises its one-line error instead of using what it read. A SIGBUS anywhere else goes to
 * the action that was there before (the default one: the process ends as it would have), which is restored.
 * The handler is set once, never over a later one (faulthandler.enable(), say): that one may chain back.
 */
#if !defined(_WIN32) && defined(SA_SIGINFO) && defined(BUS_ADRERR) && defined(MAP_ANONYMOUS) && defined(MAP_FIXED)
#define GUARD 1
#define GUARD_SLOTS 4096
static uintptr_t guard_start[GUARD_SLOTS], guard_end[GUARD_SLOTS];  /* start 0: a free slot */
static int guard_hit[GUARD_SLOTS];
static struct sigaction guard_previous;
static volatile sig_atomic_t guard_installed;
static uintptr_t guard_page = 4096;

static void guard_handler(int sig, siginfo_t *info, void *context)
{
    uintptr_t address = (uintptr_t)info->si_addr;
    if (info->si_code == BUS_ADRERR) {
        for (int i = 0; i < GUARD_SLOTS; i++) {
            uintptr_t start = __atomic_load_n(&guard_start[i], __ATOMIC_ACQUIRE);
            uintptr_t end = __atomic_load_n(&guard_end[i], __ATOMIC_ACQUIRE);
            if (!start || address < start || address >= end)
                continue;
            uintptr_t page = address & ~(guard_page - 1);
            if (mmap((void *)page, end - page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0)
                    == MAP_FAILED)
                break;
            __atomic_store_n(&guard_hit[i], 1, __ATOMIC_RELEASE);
            return;  /* the read is retried, on zeros */
        }
    }
    /* not ours: the previous action takes it. A fault happens again when the read is retried; a SIGBUS sent
     * with kill() or raise() is sent again. The guard is off from now on (guard_add refuses: reads copy). */
    guard_installed = 0;
    sigaction(SIGBUS, &guard_previous, NULL);
    if (info->si_code <= 0)
        raise(sig);
}
#endif

static PyObject *guard_install(PyObject *module, PyObject *unused)
{
#ifdef GUARD
    if (!guard_installed) {  /* once: a handler set over another one that chains back to it would loop */
        struct sigaction action;
        long page = sysconf(_SC_PAGESIZE);
        if (page > 0)
            guard_page = (uintptr_t)page;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = guard_handler;
        action.sa_flags = SA_SIGINFO;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGBUS, &action, &guard_previous) != 0)
            Py_RETURN_FALSE;
        guard_installed = 1;
    }
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *guard_add(PyObject *module, PyObject *args)
{
    unsigned long long address, length;
    if (!PyArg_ParseTuple(args, "KK", &address, &length))
        return NULL;
#ifdef GUARD
    if (!guard_installed || !address || !length)
        Py_RETURN_FALSE;
    for (int i = 0; i < GUARD_SLOTS; i++) {  /* callers hold the GIL: one writer at a time */
        if (guard_start[i])
            continue;
        __atomic_store_n(&guard_hit[i], 0, __ATOMIC_RELEASE);
        __atomic_store_n(&guard_end[i], (uintptr_t)(address + length), __ATOMIC_RELEASE);
        __atomic_store_n(&guard_start[i], (uintptr_t)address, __ATOMIC_RELEASE);
        Py_RETURN_TRUE;
    }
#endif
    Py_RETURN_FALSE;
}

/* The slot of the registered mapping at ``address``, or -1. */
static int guard_slot(unsigned long long address)
{
#ifdef GUARD
    for (int i = 0; address && i < GUARD_SLOTS; i++)
        if (__atomic_load_n(&guard_start[i], __ATOMIC_ACQUIRE) == (uintptr_t)address)
            return i;
#endif
    return -1;
}

static PyObject *guard_faulted(PyObject *module, PyObject *args)
{
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K", &address))
        return NULL;
#ifdef GUARD
    int slot = guard_slot(address);
    if (slot >= 0 && __atomic_load_n(&guard_hit[slot], __ATOMIC_ACQUIRE))
        Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

static PyObject *guard_remove(PyObject *module, PyObject *args)
{
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K", &address))
        return NULL;
#ifdef GUARD
    int slot = guard_slot(address);
    if (slot >= 0) {
        int hit = __atomic_load_n(&guard_hit[slot], __ATOMIC_ACQUIRE);
        __atomic_store_n(&guard_start[slot], 0, __ATOMIC_RELEASE);
        return PyBool_FromLong(hit);
    }
#endif
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"pair_sums", pair_sums, METH_VARARGS,
     "pair_sums(x, y, sums, x_lo, x_floor, y_lo, y_floor, rel_floor) -> 0, or 1 if a value is not finite\n\n"
     "Add one chunk of a tensor pair (float32/float64, C-contiguous, equal length) to the float64 sums."},
    {"pairs_sums", pairs_sums, METH_VARARGS,
     "pairs_sums(x_buffers, y_buffers, table, params, sums, status) -> None\n\n"
     "The sums of many tensor pairs held in byte buffers, one row of sums and one status a pair (see _native.c)."},
    {"diff_norms", diff_norms, METH_VARARGS,
     "diff_norms(x, y) -> (sum((x - y)**2), sum(y**2))\n\n"
     "Float64 sums over two finite float32/float64 arrays of equal length (C-contiguous)."},
    {"stats_rows", stats_rows, METH_VARARGS,
     "stats_rows(arrays, cancellation) -> list\n\n"
     "For each array (non-empty, C-contiguous float32/float64) the tuple (count, min, max, mean, std,\n"
     "norm, 0, 0, 0), or None where a value is not finite or variance < cancellation * mean**2."},
    {"stats_at", stats_at, METH_VARARGS,
     "stats_at(address, n, kind, cancellation, limit, small=0, cols=0, stride=0) -> tuple or None\n\n"
     "stats_rows of n contiguous values of kind 0 float32, 1 float64, 2 float16, 3 bfloat16 at address,\n"
     "with the count of |x| >= limit (limit <= 0: 0) as the row's last item; with cols, the values lie in\n"
     "rows of cols contiguous values, stride values apart, and are read in row order."},
    {"round16", round16, METH_VARARGS,
     "round16(src_address, dst_address, n, kind, cols=0, src_stride=0, dst_stride=0) -> bool\n\n"
     "Round n float32 values at src_address into float16 (kind 0) or bfloat16 (1), or only check them (2),\n"
     "writing float32 to dst_address (may equal src); False, writing nothing, if some |x| is out of range.\n"
     "With cols, the values lie in rows of cols contiguous values, the strides apart at either address."},
    {"slots", (PyCFunction)(void (*)(void))slots, METH_FASTCALL,
     "slots(inputs, input_dtypes, outputs, output_dtypes, floats, ndarray, seen, tensors, rows, later, leftover,\n"
     "      cancellation, floor) -> None\n\n"
     "The collector's bookkeeping of one op's tensors in stats mode (see _native.c)."},
    {"guard_install", guard_install, METH_NOARGS,
     "guard_install() -> bool\n\nSet the SIGBUS handler of the mapping guard (see _native.c); False where there is none."},
    {"guard_add", guard_add, METH_VARARGS,
     "guard_add(address, length) -> bool\n\nRegister a read-only file mapping; False when the guard is not set or full."},
    {"guard_faulted", guard_faulted, METH_VARARGS,
     "guard_faulted(address) -> bool\n\nWhether a read of the mapping at address went past its file's end."},
    {"guard_remove", guard_remove, METH_VARARGS,
     "guard_remove(address) -> bool\n\nForget the mapping at address; whether a read of it went past its file's end."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_native", "Loops numpy makes too many passes for (see _native.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    str_base = PyUnicode_InternFromString("base");
    str_shape = PyUnicode_InternFromString("shape");
    if (!str_base || !str_shape)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module && PyModule_AddIntConstant(module, "N_SUMS", N_SUMS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
