/* JPEG decoding for src/data/decode.rs through libjpeg-turbo's libjpeg API, which Rust cannot
 * call directly: its structs are large, version-dependent and it reports errors by calling a
 * function that must not return (we longjmp out of it).
 *
 * The decoder is set up as Pillow sets it up (RGB output, the default integer IDCT, fancy
 * upsampling), so the pixels are the ones torchvision sees. A region decode skips the rows
 * above and below the region (no IDCT or colour conversion for them) and crops the columns
 * with jpeg_crop_scanline, which libjpeg-turbo widens to whole iMCUs. */
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

/* Decodes the rectangle at (left, top) of `cols` x `rows` pixels (inside the image) into
 * `out` as packed RGB rows. Returns 0, or -1 with the reason in `error`. The data passed to
 * rtrain_jpeg_open must still be alive. */
int rtrain_jpeg_read(struct rtrain_jpeg *jpeg, uint32_t left, uint32_t top, uint32_t cols, uint32_t rows,
                     uint8_t *out, char *error, size_t error_len) {
  /* volatile: assigned after setjmp, and read again after the longjmp. */
  uint8_t *volatile line = NULL;
  if (setjmp(jpeg->escape)) {
    copy_message(jpeg->message, error, error_len);
    free(line);
    return -1;
  }
  jpeg_start_decompress(&jpeg->info);
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
