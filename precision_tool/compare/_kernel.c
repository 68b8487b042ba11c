/* The fused pass of precision_tool.compare.metrics.PairAccumulator, in C.
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

/* Add one chunk to the sums; 0 when done, 1 when a value is not finite (nothing added). */
static int accumulate_chunk(block_fn fn, const char *x, Py_ssize_t x_size, const char *y, Py_ssize_t y_size,
                            Py_ssize_t n, const params_t *p, double *sums)
{
    double add[N_SUMS] = {0};
    double max_abs = sums[S_MAX_ABS], max_rel = sums[S_MAX_REL];
    double kl_atanh = 0.0;
    int64_t rel_count = 0;
    for (Py_ssize_t start = 0; start < n; start += BLOCK) {
        const Py_ssize_t m = n - start < BLOCK ? n - start : BLOCK;
        block_t b;
        fn(x + start * x_size, y + start * y_size, m, p, &b);
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

static PyObject *accumulate(PyObject *module, PyObject *args)
{
    PyObject *x_obj, *y_obj, *sums_obj;
    params_t p;
    if (!PyArg_ParseTuple(args, "OOOddddd:accumulate", &x_obj, &y_obj, &sums_obj,
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
        PyErr_SetString(PyExc_TypeError, "accumulate: x and y must be float32 or float64, sums float64");
    } else if (y.len / y.itemsize != n) {
        PyErr_SetString(PyExc_ValueError, "accumulate: x and y differ in length");
    } else if (sums.len / (Py_ssize_t)sizeof(double) < N_SUMS) {
        PyErr_SetString(PyExc_ValueError, "accumulate: sums is too short");
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

static PyMethodDef methods[] = {
    {"accumulate", accumulate, METH_VARARGS,
     "accumulate(x, y, sums, x_lo, x_floor, y_lo, y_floor, rel_floor) -> 0, or 1 if a value is not finite\n\n"
     "Add one chunk of a tensor pair (float32/float64, C-contiguous, equal length) to the float64 sums."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_kernel", "The fused comparison pass (see precision_tool.compare.metrics).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernel(void)
{
    PyObject *module = PyModule_Create(&module_def);
    if (module && PyModule_AddIntConstant(module, "N_SUMS", N_SUMS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
