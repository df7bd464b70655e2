/* JPEG decoding for src/data/decode.rs through libjpeg-turbo's libjpeg API, which Rust cannot
 * call directly: its structs are large, version-dependent and it reports errors by calling a
 * function that must not return (we longjmp out of it).
 *
 * The decoder is set up as Pillow sets it up (RGB output, the default integer IDCT, fancy
 * upsampling), so the pixels are the ones torchvision sees. A region decode skips the rows
 * above and below the region (no IDCT or colour conversion for them) and crops the columns
 * with jpeg_crop_scanline, which libjpeg-turbo widens to whole iMCUs. A reduced decode asks
 * libjpeg for 1/2, 1/4 or 1/8 of the size, which it computes in the DCT domain (Pillow's
 * `Image.draft`): a 24-megapixel photo decoded for a 244-pixel network does an eighth of the
 * IDCT work on a sixty-fourth of the pixels.
 *
 * rtrain_jpeg_encode writes JPEGs as cameras and phones do (quality, chroma subsampling, an
 * Exif APP1 segment), for the synthetic photo set. */
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

struct rtrain_jpeg {
  struct jpeg_decompress_struct info;
  struct jpeg_error_mgr error_manager;
  jmp_buf escape;
  char message[JMSG_LENGTH_MAX];
  int truncated;
};

static void on_error(j_common_ptr info) {
  struct rtrain_jpeg *jpeg = (struct rtrain_jpeg *)info->client_data;
  (*info->err->format_message)(info, jpeg->message);
  longjmp(jpeg->escape, 1);
}

/* Warnings (level -1) go nowhere, except that running out of data is remembered: libjpeg then
 * pads the image with grey, and Pillow refuses such a file ("image file is truncated"). */
static void on_message(j_common_ptr info, int level) {
  struct rtrain_jpeg *jpeg = (struct rtrain_jpeg *)info->client_data;
  if (level == -1 && info->err->msg_code == JWRN_JPEG_EOF) {
    jpeg->truncated = 1;
  }
}

static void copy_message(const char *message, char *error, size_t error_len) {
  if (error_len > 0) {
    snprintf(error, error_len, "%s", message);
  }
}

static int read_header(struct rtrain_jpeg *jpeg, const uint8_t *data, size_t len) {
  if (setjmp(jpeg->escape)) {
    return -1;
  }
  jpeg_create_decompress(&jpeg->info);
  jpeg_mem_src(&jpeg->info, data, (unsigned long)len);
  jpeg_read_header(&jpeg->info, TRUE);
  /* Grey and YCbCr convert to RGB; CMYK/YCCK cannot (Rust decodes those another way). */
  jpeg->info.out_color_space = JCS_RGB;
  return 0;
}

/* Parses the header of `data` and reports the image size, the number of colour components
 * and where the first scan's data starts (libjpeg stops reading the header there). Returns a
 * handle for rtrain_jpeg_read, or NULL with the reason in `error`. */
struct rtrain_jpeg *rtrain_jpeg_open(const uint8_t *data, size_t len, uint32_t *width, uint32_t *height,
                                     int *components, size_t *scan_offset, char *error, size_t error_len) {
  struct rtrain_jpeg *jpeg = calloc(1, sizeof *jpeg);
  if (jpeg == NULL) {
    copy_message("out of memory", error, error_len);
    return NULL;
  }
  jpeg->info.err = jpeg_std_error(&jpeg->error_manager);
  jpeg->error_manager.error_exit = on_error;
  jpeg->error_manager.emit_message = on_message;
  jpeg->info.client_data = jpeg;
  if (read_header(jpeg, data, len) != 0) {
    copy_message(jpeg->message, error, error_len);
    jpeg_destroy_decompress(&jpeg->info);
    free(jpeg);
    return NULL;
  }
  *width = jpeg->info.image_width;
  *height = jpeg->info.image_height;
  *components = jpeg->info.num_components;
  *scan_offset = len - jpeg->info.src->bytes_in_buffer;
  return jpeg;
}

/* Decodes the image scaled by 1/`reduction` (1, 2, 4 or 8; its size is the image's divided by
 * `reduction`, rounded up), and of that the rectangle at (left, top) of `cols` x `rows` pixels
 * (inside it) into `out` as packed RGB rows. Returns 0, or -1 with the reason in `error`. The
 * data passed to rtrain_jpeg_open must still be alive. */
int rtrain_jpeg_read(struct rtrain_jpeg *jpeg, uint32_t reduction, uint32_t left, uint32_t top, uint32_t cols,
                     uint32_t rows, uint8_t *out, char *error, size_t error_len) {
  /* volatile: assigned after setjmp, and read again after the longjmp. */
  uint8_t *volatile line = NULL;
  if (setjmp(jpeg->escape)) {
    copy_message(jpeg->message, error, error_len);
    free(line);
    return -1;
  }
  jpeg->info.scale_num = 1;
  jpeg->info.scale_denom = reduction;
  jpeg_start_decompress(&jpeg->info);
  if (left + cols > jpeg->info.output_width || top + rows > jpeg->info.output_height) {
    copy_message("the region lies outside the reduced image", error, error_len);
    return -1;
  }
  if (jpeg->info.output_components != 3) {
    copy_message("unexpected number of output components", error, error_len);
    return -1;
  }
  /* Fancy upsampling treats the edges of a column crop as the image's edges, which changes
   * the outer pixels of the crop. Cropping one iMCU wider on each side (libjpeg also moves
   * the start down to an iMCU boundary) keeps those pixels out of the region. */
  JDIMENSION margin = (JDIMENSION)jpeg->info.max_h_samp_factor * (JDIMENSION)jpeg->info.min_DCT_scaled_size;
  JDIMENSION start = left > margin ? left - margin : 0;
  JDIMENSION end = left + cols + margin < jpeg->info.output_width ? left + cols + margin : jpeg->info.output_width;
  JDIMENSION width = end - start;
  if (width != jpeg->info.output_width) {
    jpeg_crop_scanline(&jpeg->info, &start, &width);
  }
  line = malloc((size_t)width * 3);
  if (line == NULL) {
    copy_message("out of memory", error, error_len);
    return -1;
  }
  if (top > 0) {
    jpeg_skip_scanlines(&jpeg->info, top);
  }
  size_t skip = (size_t)(left - start) * 3;
  for (uint32_t r = 0; r < rows; r++) {
    JSAMPROW row = line;
    if (jpeg_read_scanlines(&jpeg->info, &row, 1) != 1) {
      copy_message("the decoder returned no row", error, error_len);
      free(line);
      return -1;
    }
    memcpy(out + (size_t)r * cols * 3, line + skip, (size_t)cols * 3);
  }
  free(line);
  if (jpeg->truncated) {
    copy_message("premature end of JPEG data (the file is truncated)", error, error_len);
    return -1;
  }
  /* The rows below the region are never decoded: rtrain_jpeg_close aborts. */
  return 0;
}

void rtrain_jpeg_close(struct rtrain_jpeg *jpeg) {
  if (jpeg != NULL) {
    jpeg_destroy_decompress(&jpeg->info);
    free(jpeg);
  }
}

static void encode(struct jpeg_compress_struct *info, const uint8_t *pixels, uint32_t width, uint32_t height,
                   int quality, int luma_h, int luma_v, const uint8_t *exif, size_t exif_len) {
  info->image_width = width;
  info->image_height = height;
  info->input_components = 3;
  info->in_color_space = JCS_RGB;
  jpeg_set_defaults(info);
  jpeg_set_quality(info, quality, TRUE);
  /* Chroma subsampling is the luma component's sampling factors (2x2 is 4:2:0, 2x1 4:2:2). */
  info->comp_info[0].h_samp_factor = luma_h;
  info->comp_info[0].v_samp_factor = luma_v;
  info->optimize_coding = TRUE;
  /* Cameras write an Exif segment instead of JFIF's. */
  info->write_JFIF_header = exif_len == 0;
  jpeg_start_compress(info, TRUE);
  if (exif_len > 0) {
    jpeg_write_marker(info, JPEG_APP0 + 1, exif, (unsigned int)exif_len);
  }
  while (info->next_scanline < info->image_height) {
    JSAMPROW row = (JSAMPROW)(pixels + (size_t)info->next_scanline * width * 3);
    jpeg_write_scanlines(info, &row, 1);
  }
  jpeg_finish_compress(info);
}

/* Encodes `width` x `height` packed RGB pixels as a baseline JPEG of `quality` (1-100) with the
 * luma sampling factors `luma_h` x `luma_v`, and `exif` (without its APP1 marker and length;
 * none when `exif_len` is 0) as an APP1 segment. On success returns 0 and a buffer in `*out`
 * (free it with rtrain_jpeg_free) of `*out_len` bytes; else -1 with the reason in `error`. */
int rtrain_jpeg_encode(const uint8_t *pixels, uint32_t width, uint32_t height, int quality, int luma_h, int luma_v,
                       const uint8_t *exif, size_t exif_len, uint8_t **out, size_t *out_len, char *error,
                       size_t error_len) {
  struct rtrain_jpeg_encoder {
    struct jpeg_compress_struct info;
    struct jpeg_error_mgr error_manager;
  };
  struct rtrain_jpeg_encoder *encoder = calloc(1, sizeof *encoder);
  /* The error handler finds the escape through client_data, as the decoder's does. */
  struct rtrain_jpeg *escape = calloc(1, sizeof *escape);
  if (encoder == NULL || escape == NULL) {
    free(encoder);
    free(escape);
    copy_message("out of memory", error, error_len);
    return -1;
  }
  /* jpeg_mem_dest's buffer and size; volatile: set before setjmp returns the second time. */
  unsigned char *volatile buffer = NULL;
  unsigned long size = 0;
  encoder->info.err = jpeg_std_error(&encoder->error_manager);
  encoder->error_manager.error_exit = on_error;
  encoder->error_manager.emit_message = on_message;
  encoder->info.client_data = escape;
  if (setjmp(escape->escape)) {
    copy_message(escape->message, error, error_len);
    jpeg_destroy_compress(&encoder->info);
    free(buffer);
    free(encoder);
    free(escape);
    return -1;
  }
  jpeg_create_compress(&encoder->info);
  jpeg_mem_dest(&encoder->info, (unsigned char **)&buffer, &size);
  encode(&encoder->info, pixels, width, height, quality, luma_h, luma_v, exif, exif_len);
  jpeg_destroy_compress(&encoder->info);
  *out = buffer;
  *out_len = size;
  free(encoder);
  free(escape);
  return 0;
}

void rtrain_jpeg_free(uint8_t *buffer) { free(buffer); }
