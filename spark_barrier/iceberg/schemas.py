"""Spark <-> Arrow <-> Iceberg schema mapping for the tables written here."""

from __future__ import annotations

import logging

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import types as T

log = logging.getLogger(__name__)


def spark_schema_to_arrow(schema: T.StructType, *, keep_nullability: bool = False) -> pa.Schema:
    """Map a Spark schema to the Arrow schema of an Iceberg table Spark can write.

    Fields become nullable unless `keep_nullability`: Spark infers nullability per
    query (a literal is non-null, the same column from a join is nullable), and a
    required Iceberg column would reject later batches whose files say optional.
    Timestamps map to microsecond `timestamptz` (TimestampType) or `timestamp`
    (TimestampNTZType), matching what Spark writes with TIMESTAMP_MICROS.
    """
    return pa.schema(
        [
            pa.field(f.name, _spark_to_arrow_type(f.dataType), f.nullable or not keep_nullability)
            for f in schema.fields
        ]
    )


def _spark_to_arrow_type(dt: T.DataType) -> pa.DataType:
    simple: dict[type[T.DataType], pa.DataType] = {
        T.BooleanType: pa.bool_(),
        T.ByteType: pa.int32(),  # Iceberg has no 8/16-bit ints
        T.ShortType: pa.int32(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.FloatType: pa.float32(),
        T.DoubleType: pa.float64(),
        T.StringType: pa.string(),
        T.BinaryType: pa.binary(),
        T.DateType: pa.date32(),
        T.TimestampType: pa.timestamp("us", tz="UTC"),
        T.TimestampNTZType: pa.timestamp("us"),
    }
    if type(dt) in simple:
        return simple[type(dt)]
    if isinstance(dt, T.DecimalType):
        return pa.decimal128(dt.precision, dt.scale)
    if isinstance(dt, T.ArrayType):
        return pa.list_(pa.field("element", _spark_to_arrow_type(dt.elementType), True))
    if isinstance(dt, T.MapType):
        return pa.map_(_spark_to_arrow_type(dt.keyType), _spark_to_arrow_type(dt.valueType))
    if isinstance(dt, T.StructType):
        return pa.struct(
            [pa.field(f.name, _spark_to_arrow_type(f.dataType), True) for f in dt.fields]
        )
    raise TypeError(f"Spark type {dt.simpleString()} has no Iceberg mapping")


def iceberg_schema_to_spark(schema: Schema) -> T.StructType:
    """Map an Iceberg schema to the Spark schema used to read the table's Parquet files."""
    return T.StructType([_iceberg_to_spark_field(f) for f in schema.fields])


def _iceberg_to_spark_field(field: NestedField) -> T.StructField:
    return T.StructField(field.name, _iceberg_to_spark_type(field.field_type), not field.required)


def _iceberg_to_spark_type(it: IcebergType) -> T.DataType:
    simple: dict[type[IcebergType], T.DataType] = {
        BooleanType: T.BooleanType(),
        IntegerType: T.IntegerType(),
        LongType: T.LongType(),
        FloatType: T.FloatType(),
        DoubleType: T.DoubleType(),
        StringType: T.StringType(),
        BinaryType: T.BinaryType(),
        FixedType: T.BinaryType(),
        DateType: T.DateType(),
        TimestamptzType: T.TimestampType(),
        TimestampType: T.TimestampNTZType(),
    }
    if type(it) in simple:
        return simple[type(it)]
    if isinstance(it, DecimalType):
        return T.DecimalType(it.precision, it.scale)
    if isinstance(it, ListType):
        return T.ArrayType(_iceberg_to_spark_type(it.element_type), not it.element_required)
    if isinstance(it, MapType):
        return T.MapType(
            _iceberg_to_spark_type(it.key_type),
            _iceberg_to_spark_type(it.value_type),
            not it.value_required,
        )
    if isinstance(it, StructType):
        return T.StructType([_iceberg_to_spark_field(f) for f in it.fields])
    raise TypeError(f"Iceberg type {it} has no Spark mapping")
