"""Data sets read for tables and ground truth: COCO/LVIS schemas, compressed RLE, YOLO labels
and Ultralytics data.yaml descriptions."""
