#include "media/image/image.h"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// libjpeg's header needs size_t and FILE first.
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

namespace ferry::media {
namespace {

constexpr size_t kErrorSize = 256;
constexpr size_t kPngChunkMallocMax = 8 << 20;  // one ancillary chunk (iCCP, zTXt, ...)
constexpr unsigned kPngChunkCacheMax = 128;     // ancillary chunks kept

uint32_t Be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }

bool IsPng(absl::string_view b) {
  return b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0;
}
bool IsJpeg(absl::string_view b) {
  return b.size() >= 3 && static_cast<uint8_t>(b[0]) == 0xFF &&
         static_cast<uint8_t>(b[1]) == 0xD8 && static_cast<uint8_t>(b[2]) == 0xFF;
}

absl::Status CheckSize(int64_t width, int64_t height, const ImageLimits& limits) {
  if (width <= 0 || height <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image: invalid dimensions ", width, "x", height));
  }
  if (width > limits.max_width || height > limits.max_height) {
    return absl::InvalidArgumentError(absl::StrCat("image: ", width, "x", height,
                                                   " exceeds the limit of ", limits.max_width, "x",
                                                   limits.max_height));
  }
  if (width * height > limits.max_pixels) {
    return absl::InvalidArgumentError(absl::StrCat("image: ", width, "x", height, " is ",
                                                   width * height, " pixels, over the limit of ",
                                                   limits.max_pixels));
  }
  return absl::OkStatus();
}

// EXIF orientation from a TIFF structure (a JPEG's APP1 after "Exif\0\0", a PNG's eXIf chunk);
// 1 when absent or invalid.
int TiffOrientation(const uint8_t* t, size_t tn) {
  if (tn < 8) return 1;
  bool le;
  if (t[0] == 'I' && t[1] == 'I') {
    le = true;
  } else if (t[0] == 'M' && t[1] == 'M') {
    le = false;
  } else {
    return 1;
  }
  auto u16 = [&](size_t off) -> uint32_t {
    return le ? (t[off] | (t[off + 1] << 8)) : ((t[off] << 8) | t[off + 1]);
  };
  auto u32 = [&](size_t off) -> uint32_t {
    return le ? (uint32_t{t[off]} | (uint32_t{t[off + 1]} << 8) | (uint32_t{t[off + 2]} << 16) |
                 (uint32_t{t[off + 3]} << 24))
              : Be32(t + off);
  };
  if (u16(2) != 42) return 1;
  size_t ifd = u32(4);
  if (ifd > tn || tn - ifd < 2) return 1;
  size_t count = u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    size_t e = ifd + 2 + 12 * i;
    if (e > tn || tn - e < 12) return 1;
    if (u16(e) != 0x0112) continue;
    if (u16(e + 2) != 3 || u32(e + 4) < 1) return 1;  // SHORT, at least one value
    uint32_t v = u16(e + 8);
    return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
  }
  return 1;
}

absl::StatusOr<ImageInfo> ProbePng(absl::string_view b) {
  // Signature, then IHDR: length 13, "IHDR", width, height, depth, colour type, 3 bytes.
  if (b.size() < 8 + 8 + 13) return absl::InvalidArgumentError("image: truncated PNG header");
  const auto* p = reinterpret_cast<const uint8_t*>(b.data()) + 8;
  if (Be32(p) != 13 || std::memcmp(p + 4, "IHDR", 4) != 0) {
    return absl::InvalidArgumentError("image: malformed PNG (the first chunk is not IHDR)");
  }
  ImageInfo info;
  info.format = ImageFormat::kPng;
  uint32_t w = Be32(p + 8), h = Be32(p + 12);
  if (w > 0x7fffffffu || h > 0x7fffffffu) {
    return absl::InvalidArgumentError("image: malformed PNG (dimensions over 2^31)");
  }
  info.width = static_cast<int>(w);
  info.height = static_cast<int>(h);
  info.bit_depth = p[16];
  // An eXIf chunk, before or after the image data (PIL reads both; the last one counts): walk the
  // chunk headers, a few bytes each, to IEND or the end of the data.
  const auto* d = reinterpret_cast<const uint8_t*>(b.data());
  for (size_t i = 8; b.size() - i >= 12;) {
    size_t len = Be32(d + i);
    if (len > b.size() - i - 12) break;
    if (std::memcmp(d + i + 4, "eXIf", 4) == 0) info.orientation = TiffOrientation(d + i + 8, len);
    if (std::memcmp(d + i + 4, "IEND", 4) == 0) break;
    i += 12 + len;
  }
  switch (p[17]) {
    case 0:
      info.channels = 1;
      break;
    case 2:
      info.channels = 3;
      break;
    case 3:
      info.channels = 3;
      info.palette = true;
      break;
    case 4:
      info.channels = 2;
      break;
    case 6:
      info.channels = 4;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("image: malformed PNG (colour type ", p[17], ")"));
  }
  return info;
}

absl::StatusOr<ImageInfo> ProbeJpeg(absl::string_view b) {
  const auto* d = reinterpret_cast<const uint8_t*>(b.data());
  size_t n = b.size(), i = 2;
  ImageInfo info;
  info.format = ImageFormat::kJpeg;
  bool exif_seen = false;
  for (;;) {
    while (i < n && d[i] != 0xFF) ++i;  // PIL skips garbage between markers too
    while (i < n && d[i] == 0xFF) ++i;  // fill bytes
    if (i >= n) return absl::InvalidArgumentError("image: truncated JPEG (no frame header)");
    uint8_t m = d[i++];
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;  // no length
    if (m == 0xD9 || m == 0xDA) {
      return absl::InvalidArgumentError(
          "image: malformed JPEG (scan or end before a frame header)");
    }
    if (n - i < 2) return absl::InvalidArgumentError("image: truncated JPEG marker");
    size_t len = Be16(d + i);
    if (len < 2) return absl::InvalidArgumentError("image: malformed JPEG marker length");
    if (n - i < len) return absl::InvalidArgumentError("image: truncated JPEG marker segment");
    const uint8_t* seg = d + i + 2;
    size_t sn = len - 2;
    if (m == 0xE1 && !exif_seen && sn >= 6 && std::memcmp(seg, "Exif\0\0", 6) == 0) {
      exif_seen = true;  // the first Exif segment, as PIL keeps it
      info.orientation = TiffOrientation(seg + 6, sn - 6);
    }
    bool sof = (m >= 0xC0 && m <= 0xCF) && m != 0xC4 && m != 0xC8 && m != 0xCC;
    if (sof) {
      if (sn < 6) return absl::InvalidArgumentError("image: malformed JPEG frame header");
      info.bit_depth = seg[0];
      info.height = Be16(seg + 1);
      info.width = Be16(seg + 3);
      info.channels = seg[5];
      if (info.height == 0) {
        return absl::InvalidArgumentError("image: unsupported JPEG (height defined by DNL)");
      }
      return info;
    }
    i += len;
  }
}

// ---- libpng, C style: nothing non-trivial alive across setjmp/longjmp ----

struct PngJob {
  const uint8_t* data;
  size_t size;
  size_t pos;
  int64_t max_width, max_height, max_pixels;
  uint8_t* (*allocate)(void* ctx, size_t n);
  void* allocate_ctx;
  png_bytepp rows;  // here, not a local: it changes after setjmp
  int width, height;
  char error[kErrorSize];
};

void PngError(png_structp png, png_const_charp msg) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->error, kErrorSize, "%s", msg);
  png_longjmp(png, 1);
}
void PngWarning(png_structp, png_const_charp) {}

void PngRead(png_structp png, png_bytep out, size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (job->size - job->pos < n) png_error(png, "truncated PNG (the data ends inside a chunk)");
  std::memcpy(out, job->data + job->pos, n);
  job->pos += n;
}

// Returns 1 on success (job->width/height set, pixels in the allocated buffer), 0 with job->error.
int DecodePngC(PngJob* job) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, job, PngError, PngWarning);
  if (png == nullptr) {
    std::snprintf(job->error, kErrorSize, "libpng: cannot create a reader");
    return 0;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(job->error, kErrorSize, "libpng: cannot create an info struct");
    return 0;
  }
  job->rows = nullptr;
  if (setjmp(png_jmpbuf(png))) {
    std::free(job->rows);
    job->rows = nullptr;
    png_destroy_read_struct(&png, &info, nullptr);
    return 0;
  }
  png_set_read_fn(png, job, PngRead);
  png_set_user_limits(png, static_cast<png_uint_32>(job->max_width),
                      static_cast<png_uint_32>(job->max_height));
  png_set_chunk_malloc_max(png, kPngChunkMallocMax);
  png_set_chunk_cache_max(png, kPngChunkCacheMax);
  // Text, colour profiles and EXIF change no pixel of convert("RGB"): skipped, never inflated.
  static const png_byte kSkipped[] = "tEXt\0zTXt\0iTXt\0iCCP\0sPLT\0eXIf";
  png_set_keep_unknown_chunks(png, PNG_HANDLE_CHUNK_NEVER, kSkipped, 6);
  png_read_info(png, info);
  png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  int depth = png_get_bit_depth(png, info), type = png_get_color_type(png, info);
  if (static_cast<int64_t>(w) * h > job->max_pixels) {
    std::snprintf(job->error, kErrorSize, "image: %ux%u is over the limit of %lld pixels", w, h,
                  static_cast<long long>(job->max_pixels));
    png_longjmp(png, 1);
  }
  // PIL's convert("RGB"): 16-bit grey (mode "I") clips to 0..255; everything else 16-bit keeps
  // the high byte; palettes expand; transparency (tRNS) is ignored; alpha is dropped.
  const int grey16 = (type == PNG_COLOR_TYPE_GRAY && depth == 16);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16 && !grey16) png_set_strip_16(png);
  // The expansions above also turn tRNS into an alpha channel, which goes with the rest.
  if ((type & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) {
    png_set_strip_alpha(png);
  }
  if ((type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA) && !grey16) {
    png_set_gray_to_rgb(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  size_t stride = static_cast<size_t>(w) * 3;
  if (png_get_rowbytes(png, info) != (grey16 ? static_cast<size_t>(w) * 2 : stride)) {
    png_error(png, "unexpected row size after the RGB transforms");
  }
  uint8_t* out = job->allocate(job->allocate_ctx, stride * h);
  job->rows = static_cast<png_bytepp>(std::malloc(sizeof(png_bytep) * h));
  png_bytepp rows = job->rows;
  if (out == nullptr || rows == nullptr) png_error(png, "out of memory");
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = out + y * stride;
  png_read_image(png, rows);
  if (grey16) {
    for (png_uint_32 y = 0; y < h; ++y) {
      uint8_t* r = rows[y];
      for (size_t x = w; x-- > 0;) {  // back to front: reads at 2x, writes at 3x
        unsigned v = (unsigned{r[2 * x]} << 8) | r[2 * x + 1];
        uint8_t c = v > 255 ? 255 : static_cast<uint8_t>(v);
        r[3 * x] = r[3 * x + 1] = r[3 * x + 2] = c;
      }
    }
  }
  std::free(job->rows);
  job->rows = nullptr;
  png_destroy_read_struct(&png, &info, nullptr);
  job->width = static_cast<int>(w);
  job->height = static_cast<int>(h);
  return 1;
}

// ---- libjpeg-turbo, C style ----

struct JpegJob {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr err;
  jpeg_progress_mgr progress;
  jmp_buf jmp;
  const uint8_t* data;
  size_t size;
  int64_t max_width, max_height, max_pixels, max_memory;
  int max_scans;
  uint8_t* (*allocate)(void* ctx, size_t n);
  void* allocate_ctx;
  int width, height;
  char error[kErrorSize];
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* job = static_cast<JpegJob*>(cinfo->client_data);
  char msg[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, msg);
  std::snprintf(job->error, kErrorSize, "libjpeg: %s", msg);
  std::longjmp(job->jmp, 1);
}

void JpegMessage(j_common_ptr cinfo, int level) {
  // A warning on premature end of data is a truncated file: PIL refuses it ("image file is
  // truncated"), and so do we. Other warnings (extraneous bytes) PIL tolerates.
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* job = static_cast<JpegJob*>(cinfo->client_data);
    std::snprintf(job->error, kErrorSize, "truncated JPEG (premature end of data)");
    std::longjmp(job->jmp, 1);
  }
}

void JpegProgress(j_common_ptr cinfo) {
  auto* job = static_cast<JpegJob*>(cinfo->client_data);
  if (job->cinfo.input_scan_number > job->max_scans) {
    std::snprintf(job->error, kErrorSize, "JPEG has more than %d scans", job->max_scans);
    std::longjmp(job->jmp, 1);
  }
}

// PIL's reading of a 4-component JPEG and its convert("RGB"): PIL takes the samples as Adobe's
// inverted CMYK whatever the file says ("CMYK;I": each sample 255 - s), then for each pixel
// nk = 255 - K and R = nk - C * nk / 255 rounded as its MULDIV255 does (and so G, B). With
// s the samples as libjpeg gives them, nk = s_k and C = 255 - s_c.
void CmykRowToRgb(const uint8_t* in, uint8_t* out, size_t w) {
  for (size_t x = 0; x < w; ++x, in += 4, out += 3) {
    const int nk = in[3];
    for (int i = 0; i < 3; ++i) {
      const int t = (255 - in[i]) * nk + 128;
      const int v = nk - (((t >> 8) + t) >> 8);
      out[i] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
    }
  }
}

int DecodeJpegC(JpegJob* job) {
  job->cinfo.err = jpeg_std_error(&job->err);
  job->err.error_exit = JpegErrorExit;
  job->err.emit_message = JpegMessage;
  job->cinfo.client_data = job;
  if (setjmp(job->jmp)) {
    jpeg_destroy_decompress(&job->cinfo);
    return 0;
  }
  jpeg_create_decompress(&job->cinfo);
  job->cinfo.mem->max_memory_to_use = static_cast<long>(job->max_memory);
  job->progress.progress_monitor = JpegProgress;
  job->cinfo.progress = &job->progress;
  jpeg_mem_src(&job->cinfo, job->data, static_cast<unsigned long>(job->size));
  jpeg_read_header(&job->cinfo, TRUE);
  jpeg_decompress_struct* c = &job->cinfo;
  int64_t w = c->image_width, h = c->image_height;
  if (w <= 0 || h <= 0 || w > job->max_width || h > job->max_height || w * h > job->max_pixels) {
    std::snprintf(job->error, kErrorSize, "image: %lldx%lld exceeds the limits", (long long)w,
                  (long long)h);
    std::longjmp(job->jmp, 1);
  }
  if (c->jpeg_color_space == JCS_GRAYSCALE) {
    c->out_color_space = JCS_GRAYSCALE;
  } else if (c->jpeg_color_space == JCS_YCbCr || c->jpeg_color_space == JCS_RGB) {
    c->out_color_space = JCS_RGB;
  } else if (c->jpeg_color_space == JCS_CMYK || c->jpeg_color_space == JCS_YCCK) {
    c->out_color_space = JCS_CMYK;  // libjpeg turns YCCK into CMYK
  } else {
    std::snprintf(job->error, kErrorSize, "unsupported JPEG colour space (%d components)",
                  c->num_components);
    std::longjmp(job->jmp, 1);
  }
  // libjpeg's defaults, as PIL decodes: JDCT_ISLOW, fancy upsampling, block smoothing.
  jpeg_start_decompress(c);
  if (static_cast<int64_t>(c->output_width) != w || static_cast<int64_t>(c->output_height) != h) {
    std::snprintf(job->error, kErrorSize, "libjpeg: unexpected output size");
    std::longjmp(job->jmp, 1);
  }
  size_t stride = static_cast<size_t>(w) * 3;
  uint8_t* out = job->allocate(job->allocate_ctx, stride * h);
  if (out == nullptr) {
    std::snprintf(job->error, kErrorSize, "out of memory");
    std::longjmp(job->jmp, 1);
  }
  const int grey = c->out_color_space == JCS_GRAYSCALE;
  const int cmyk = c->out_color_space == JCS_CMYK;
  JSAMPROW cmyk_row = nullptr;
  if (cmyk) {
    // One row of 4 samples, from libjpeg's pool (freed with the decompressor, even on error).
    cmyk_row = static_cast<JSAMPROW>(
        (*c->mem->alloc_large)(reinterpret_cast<j_common_ptr>(c), JPOOL_IMAGE, 4 * (size_t)w));
  }
  while (c->output_scanline < c->output_height) {
    JSAMPROW row = out + static_cast<size_t>(c->output_scanline) * stride;
    if (cmyk) {
      jpeg_read_scanlines(c, &cmyk_row, 1);
      CmykRowToRgb(cmyk_row, row, (size_t)w);
      continue;
    }
    jpeg_read_scanlines(c, &row, 1);
    if (grey) {
      for (size_t x = w; x-- > 0;) row[3 * x] = row[3 * x + 1] = row[3 * x + 2] = row[x];
    }
  }
  jpeg_finish_decompress(c);
  jpeg_destroy_decompress(c);
  job->width = static_cast<int>(w);
  job->height = static_cast<int>(h);
  return 1;
}

uint8_t* ResizeVector(void* ctx, size_t n) {
  auto* v = static_cast<std::vector<uint8_t>*>(ctx);
  v->resize(n);
  return v->data();
}

}  // namespace

const char* ImageFormatName(ImageFormat format) {
  return format == ImageFormat::kPng ? "png" : "jpeg";
}

absl::StatusOr<ImageInfo> ProbeImage(absl::string_view bytes, const ImageLimits& limits) {
  if (static_cast<int64_t>(bytes.size()) > limits.max_input_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image: ", bytes.size(), " bytes, over the limit of ", limits.max_input_bytes));
  }
  absl::StatusOr<ImageInfo> info;
  if (IsPng(bytes)) {
    info = ProbePng(bytes);
  } else if (IsJpeg(bytes)) {
    info = ProbeJpeg(bytes);
  } else {
    return absl::InvalidArgumentError("image: not a PNG or JPEG file");
  }
  if (!info.ok()) return info.status();
  if (absl::Status s = CheckSize(info->width, info->height, limits); !s.ok()) return s;
  return info;
}

absl::StatusOr<RgbImage> DecodeImage(absl::string_view bytes, const ImageLimits& limits) {
  absl::StatusOr<ImageInfo> info = ProbeImage(bytes, limits);
  if (!info.ok()) return info.status();
  RgbImage image;
  if (info->format == ImageFormat::kPng) {
    auto* job = new PngJob{};
    job->data = reinterpret_cast<const uint8_t*>(bytes.data());
    job->size = bytes.size();
    job->max_width = limits.max_width;
    job->max_height = limits.max_height;
    job->max_pixels = limits.max_pixels;
    job->allocate = ResizeVector;
    job->allocate_ctx = &image.pixels;
    int ok = DecodePngC(job);
    std::string error = job->error;
    image.width = job->width;
    image.height = job->height;
    delete job;
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("image: PNG: ", error));
  } else {
    auto* job = new JpegJob{};
    job->data = reinterpret_cast<const uint8_t*>(bytes.data());
    job->size = bytes.size();
    job->max_width = limits.max_width;
    job->max_height = limits.max_height;
    job->max_pixels = limits.max_pixels;
    job->max_memory = limits.max_decoder_memory_bytes;
    job->max_scans = limits.max_jpeg_scans;
    job->allocate = ResizeVector;
    job->allocate_ctx = &image.pixels;
    int ok = DecodeJpegC(job);
    std::string error = job->error;
    image.width = job->width;
    image.height = job->height;
    delete job;
    if (!ok) return absl::InvalidArgumentError(absl::StrCat("image: JPEG: ", error));
  }
  return image;
}

RgbImage ApplyOrientation(const RgbImage& in, int orientation) {
  if (orientation < 2 || orientation > 8) return in;
  const int w = in.width, h = in.height;
  const bool swap = orientation >= 5;
  RgbImage out;
  out.width = swap ? h : w;
  out.height = swap ? w : h;
  out.pixels.resize(in.pixels.size());
  for (int y = 0; y < out.height; ++y) {
    for (int x = 0; x < out.width; ++x) {
      int sx = x, sy = y;
      switch (orientation) {
        case 2:
          sx = w - 1 - x;
          break;  // FLIP_LEFT_RIGHT
        case 3:
          sx = w - 1 - x;
          sy = h - 1 - y;
          break;  // ROTATE_180
        case 4:
          sy = h - 1 - y;
          break;  // FLIP_TOP_BOTTOM
        case 5:
          sx = y;
          sy = x;
          break;  // TRANSPOSE
        case 6:
          sx = y;
          sy = h - 1 - x;
          break;  // ROTATE_270 (clockwise)
        case 7:
          sx = w - 1 - y;
          sy = h - 1 - x;
          break;  // TRANSVERSE
        case 8:
          sx = w - 1 - y;
          sy = x;
          break;  // ROTATE_90 (counter-clockwise)
      }
      const uint8_t* s = &in.pixels[(static_cast<size_t>(sy) * w + sx) * 3];
      uint8_t* d = &out.pixels[(static_cast<size_t>(y) * out.width + x) * 3];
      d[0] = s[0];
      d[1] = s[1];
      d[2] = s[2];
    }
  }
  return out;
}

}  // namespace ferry::media
