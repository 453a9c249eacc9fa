"""Coded concepts written into ctpipe's DICOM results (SR and SEG).

Standard codes (SNOMED CT ``SCT``, DICOM ``DCM``, LOINC ``LN``, UCUM units) wherever one exists;
the rest come from ctpipe's private coding scheme ``99CTPIPE`` (DICOM PS3.16 §8.2: designators
beginning with "99" are private), which an SR that uses one of them declares in its
CodingSchemeIdentificationSequence with a name, version and responsible organisation (PS3.3 C.12.1.1.8; no
Coding Scheme UID, which dciodvfy warns about as one more term it does not know; an SR of standard codes only
declares none). dciodvfy still warns once per private code item, and once for the declaration's own designator
("Warning - Unrecognized defined term <99CTPIPE> for value 1 of attribute <Coding Scheme Designator>"): it checks
designators against the list of PS3.16 and of the schemes registered there (99SDM, 99PMP, ...) and does not read
the declaration; only a standard code in place of a private one makes a warning fewer.

========================  ==========================  =====================================================
concept                   code                        used for
========================  ==========================  =====================================================
CT Chest                  LN 24627-2                  SR: procedure reported
Nodule                    SCT 27925004                SR: finding type; SEG: segmented property type
Morphologically abnormal  SCT 49755003                SEG: category of nodule segments
structure
Anatomical structure      SCT 91723000                SEG: category of organ segments
Tissue                    SCT 85756007                SEG: category of the bone segment
Lung                      SCT 39607008                SR: finding site, lung volumes
Left lung / Right lung    SCT 44029006 / 3341006      SR: the side stated Absent (one_lung); in SEGs of layout
                                                      1 the lung segments' type and the nodule segments'
                                                      anatomic region
Lung, laterality Left /   SCT 39607008, modifier      SEG: lung segments' type (CID 7151, CID 7155; modifier
Right                     SCT 7771000 / 24028007      CID 244); nodule segments' anatomic region (CID 4)
Upper / Lower lobe of     SCT 45653009 / 90572001,    SEG: nodule segments' anatomic region when the lobe is
lung, laterality          modifier Left / Right;      known (CID 4, CID 7151)
                          SCT 72481006 Middle lobe
                          of right lung
Upper/lower lobe of left  SCT 44714003 / 41224006     SR: finding site when the lobe is known
lung
Upper/middle/lower lobe   SCT 42400003 / 72481006 /   SR: finding site when the lobe is known
of right lung             266005
Left / Right / Right and  SCT 7771000 / 24028007 /    SR: laterality of finding sites and lung volumes
left                      51440002
Airway structure          SCT 89187006                SEG: airway segment
Bone                      SCT 3138006                 SEG: bone segment
Entire body               SCT 38266002                SEG: body segment
Long axis                 SCT 103339001               SR: longest in-plane chord of the nodule on the slice
                                                      where it is largest (mm; that image referenced);
                                                      in SRs of earlier versions the longest 3-D extent
Short axis                SCT 103340004               SR: longest chord perpendicular to the long axis on
                                                      that slice (mm; that image referenced)
Volume                    SCT 118565006               SR: nodule volume (mm³), lung volumes (mL)
Certainty of Finding      DCM 111012                  SR: detector score (0..1, unit "1"), the likelihood
                                                      that the finding is a nodule (CID 6048, as CAD
                                                      reports state it); DCM 122157 "Probability" in SRs
                                                      of layouts 1-3
Present / Absent          SCT 52101004 / 272519000    SR: "Nodule" present / absent (the explicit
                                                      no-findings statement; CID 240); SCT 2667000 Absent
                                                      in SRs of layouts 1-3
Quality finding           DCM 111052                  SR: name of each quality flag that is a deficiency of
                                                      the images (informational flags: below); in SRs of
                                                      layouts 1-4 of every flag
Anatomy coverage          DCM 130576, finding site    SR: value of "Quality finding" for lungs_apex_cut /
incomplete                SCT 39607008 Lung with      lungs_base_cut: the scan range cuts the lungs' apex or
                          topographical modifier      base (CID 6315; CID 2); 99CTPIPE lungs_apex_cut /
                          SCT 43674008 Apical /       lungs_base_cut in SRs of layouts 1-4
                          SCT 57195005 Basal
Poor FOV selection        DCM 130577                  SR: value of "Quality finding" for fov_cuts_body (CID
                                                      6315); 99CTPIPE fov_cuts_body in SRs of layouts 1-7
Left / Right lung: Absent SCT 44029006 / 3341006 =    SR: one_lung, the side with no lung (CID 240); in SRs of
                          SCT 272519000               layouts 1-4 the Quality finding 99CTPIPE no_left_lung /
                                                      no_right_lung
Anatomy coverage          DCM 130576, finding site    SR: value of "Quality finding" for one_lung where the
incomplete                SCT 39607008 Lung with      field of view cuts the side without lung off: that lung
                          laterality                  may lie outside the images, not absent
Airway coverage           99CTPIPE airway_coverage    SR: Absent (SCT 272519000) for airway_not_in_scan (no trachea in the
                                                      scan); a Quality finding in SRs of layouts 1-4
Volume-equivalent sphere  99CTPIPE                    SR: diameter of the sphere of the nodule's volume (mm);
diameter                  equiv_diameter              neither DCM nor SCT codes this concept, and SCT
                                                      81827009 "Diameter" reads as a measured axis (an SR
                                                      of earlier versions' Diameter without derivation)
Maximum 3D extent         99CTPIPE max_extent_3d      SR: longest distance between two voxel centres of the
                                                      nodule in 3-D (mm), on no one image (IBSI L0JK
                                                      "Maximum 3D Diameter of a Mesh" is measured between
                                                      the vertices of a mesh, half a voxel farther out)
Diameter, derivation      SCT 81827009, modifier      SR: mean of the long and short axis (mm), the
Mean                      DCM 121401 = SCT 373098007  "mean diameter" of Fleischner 2017 and Lung-RADS
                                                      v2022 (they round it to the nearest mm), in the
                                                      plane of the image both axes reference (CID 7470,
                                                      CID 3488); 99CTPIPE mean_diameter in SRs of
                                                      earlier versions
Emphysema index           99CTPIPE emphysema_index    SR: % of lung voxels below -950 HU
Nodule composition        99CTPIPE composition        SR: solid / part-solid / ground glass
Solid                     SCT 35702001                SR: value of "Nodule composition" (99CTPIPE solid in SRs
                                                      of layouts 1-6)
Ground glass opacity      DCM 112120                  SR: value of "Nodule composition" (CID 6102, CID 6104;
                                                      99CTPIPE ground_glass in SRs of layouts 1-6)
part_solid                99CTPIPE part_solid         SR: value of "Nodule composition": no standard code
Lung coverage             99CTPIPE lung_coverage      SR: complete / partial / absent
Complete / Partial /      SCT 255594003 / 255609007 / SR: values of "Lung coverage" and "Airway coverage"
Absent                    272519000                   (CID 67; CID 240); 99CTPIPE complete / partial /
                                                      absent in SRs of layouts 1-6
Contrast phase            99CTPIPE contrast_phase     SR: non_contrast / arterial / venous, ctpipe's codes
                                                      too: no standard code names a CT series' contrast
                                                      phase (DCM 109058 "Contrast Phase" is a subpart of a
                                                      cardiac catheterization procedure, CID 3250; CID
                                                      10014 lists the procedures "CT with/without
                                                      contrast", no phases); DCM 109058 in SRs of layout 3
quality flag codes        99CTPIPE <flag code>        SR: values of "Quality finding", one per deficiency
                                                      flag of :data:`pipeline.reconstruction.quality.FLAGS`
                                                      without a standard code; the contrast phase flags are
                                                      the contrast phase item's value, not repeated
========================  ==========================  =====================================================

Units (UCUM): mm, mm3, ml, %, 1 (no units).
"""

from __future__ import annotations

from pydicom.sr.coding import Code

from ..reconstruction.organs import OUTLINE_COLORS

PRIVATE_SCHEME = "99CTPIPE"
PRIVATE_SCHEME_NAME = "ctpipe private codes"
PRIVATE_SCHEME_VERSION = "1"
PRIVATE_SCHEME_ORGANIZATION = "ctpipe"

# --- procedure, finding type, categories -------------------------------------------------
CT_CHEST = Code("24627-2", "LN", "CT Chest")
NODULE = Code("27925004", "SCT", "Nodule")
MORPHOLOGICALLY_ABNORMAL_STRUCTURE = Code("49755003", "SCT", "Morphologically Abnormal Structure")
ANATOMICAL_STRUCTURE = Code("91723000", "SCT", "Anatomical Structure")
TISSUE = Code("85756007", "SCT", "Tissue")

# --- anatomy ------------------------------------------------------------------------------
LUNG = Code("39607008", "SCT", "Lung")
LEFT_LUNG = Code("44029006", "SCT", "Left lung")
RIGHT_LUNG = Code("3341006", "SCT", "Right lung")
AIRWAY = Code("89187006", "SCT", "Airway structure")
BONE = Code("3138006", "SCT", "Bone")
ENTIRE_BODY = Code("38266002", "SCT", "Entire body")
LOBES: dict[tuple[str, str], Code] = {
    ("left", "upper"): Code("44714003", "SCT", "Upper lobe of left lung"),
    ("left", "lower"): Code("41224006", "SCT", "Lower lobe of left lung"),
    ("right", "upper"): Code("42400003", "SCT", "Upper lobe of right lung"),
    ("right", "middle"): Code("72481006", "SCT", "Middle lobe of right lung"),
    ("right", "lower"): Code("266005", "SCT", "Lower lobe of right lung"),
}
LATERALITY: dict[str, Code] = {
    "left": Code("7771000", "SCT", "Left"),
    "right": Code("24028007", "SCT", "Right"),
    "both": Code("51440002", "SCT", "Right and left"),
}

# --- measurements and evaluations ------------------------------------------------------------
#: the nodule's mean diameter with derivation :data:`MEAN` (the mean of its long and short axis); without a
#: derivation, in SRs of earlier versions, the equivalent-sphere diameter, and read back so
DIAMETER = Code("81827009", "SCT", "Diameter")
#: TID 1419's concept modifier naming how a measurement is derived (DCM 121401), and its value Mean (CID 3488)
DERIVATION = Code("121401", "DCM", "Derivation")
MEAN = Code("373098007", "SCT", "Mean")
#: the longest in-plane chord on the slice where the nodule is largest (in SRs of earlier versions: its 3-D extent)
LONG_AXIS = Code("103339001", "SCT", "Long axis")
#: the longest chord perpendicular to the long axis on the same slice
SHORT_AXIS = Code("103340004", "SCT", "Short axis")
VOLUME = Code("118565006", "SCT", "Volume")
#: the detector score (0..1): the likelihood that the finding detected is in fact a nodule (PS3.16's definition; CID 6048)
CERTAINTY_OF_FINDING = Code("111012", "DCM", "Certainty of Finding")
#: read back from SRs of layouts 1-3, which stated the detector score so (a code of no context group); never written
PROBABILITY = Code("122157", "DCM", "Probability")
PRESENT = Code("52101004", "SCT", "Present")
#: Present and Absent as CID 240 "Present-Absent" pairs them
ABSENT = Code("272519000", "SCT", "Absent")
#: read back from SRs of layouts 1-3, which stated Absent so (a code of no PS3.16 context group); never written
ABSENT_EARLIER = Code("2667000", "SCT", "Absent")
#: a quality related deficiency detected within an image (PS3.16): the name of each quality flag that is one; the
#: informational flags are stated otherwise (:data:`INFORMATIONAL_FLAGS`)
QUALITY_FINDING = Code("111052", "DCM", "Quality Finding")
#: a Quality Finding: the series does not cover all of the anatomy of interest (CID 6315, a group of series quality
#: findings written for prostate MRI; the code itself names no modality or organ); where, by :data:`CUT_LUNG_ENDS`
ANATOMY_COVERAGE_INCOMPLETE = Code("130576", "DCM", "Anatomy coverage incomplete")
#: a Quality Finding: the field of view is poorly chosen (CID 6315, as :data:`ANATOMY_COVERAGE_INCOMPLETE`): the quality
#: flag fov_cuts_body, the field of view cutting the body off (99CTPIPE fov_cuts_body in SRs of layouts 1-7)
POOR_FOV_SELECTION = Code("130577", "DCM", "Poor FOV selection")
#: quality flag → the standard Quality Finding that names it, without a finding site
STANDARD_QUALITY_FINDINGS: dict[str, Code] = {"fov_cuts_body": POOR_FOV_SELECTION}
#: the concept modifier of a finding site saying which part of it (CID 2 "Anatomic Modifier" holds its values)
TOPOGRAPHICAL_MODIFIER = Code("106233006", "SCT", "Topographical modifier")
#: the concept modifier of a finding site saying which side (CID 244 "Laterality" holds its values)
LATERALITY_MODIFIER = Code("272741003", "SCT", "Laterality")
APICAL = Code("43674008", "SCT", "Apical")
BASAL = Code("57195005", "SCT", "Basal")
#: quality flag → the end of the lungs the scan range cuts, stated as Anatomy coverage incomplete at the Lung with this
#: topographical modifier (in SRs of layouts 1-4: 99CTPIPE lungs_apex_cut / lungs_base_cut)
CUT_LUNG_ENDS: dict[str, Code] = {"lungs_apex_cut": APICAL, "lungs_base_cut": BASAL}

MM = Code("mm", "UCUM", "millimeter")
MM3 = Code("mm3", "UCUM", "cubic millimeter")
ML = Code("ml", "UCUM", "milliliter")
PERCENT = Code("%", "UCUM", "percent")
NO_UNITS = Code("1", "UCUM", "no units")


def private(value: str, meaning: str) -> Code:
    """A code of ctpipe's private scheme (:data:`PRIVATE_SCHEME`)."""
    return Code(value, PRIVATE_SCHEME, meaning)


#: the diameter of the sphere of the nodule's volume: not a measured axis, which "Diameter" (SCT 81827009) is read as
EQUIVALENT_DIAMETER = private("equiv_diameter", "Volume-equivalent sphere diameter")
#: the nodule's longest extent in 3-D: no axis a reader measures on an image, so not "Long axis"
MAX_EXTENT = private("max_extent_3d", "Maximum 3D extent")
#: read back from SRs of earlier versions, which named the mean of the long and short axis so; never written (now
#: :data:`DIAMETER` with derivation :data:`MEAN`)
MEAN_DIAMETER = private("mean_diameter", "Mean diameter in image plane")
EMPHYSEMA_INDEX = private("emphysema_index", "Emphysema index (LAA-950)")
COMPOSITION = private("composition", "Nodule composition")
#: the values of :data:`COMPOSITION`: standard codes where one names the composition (SNOMED CT's qualifier value
#: Solid; DCM Ground glass opacity, CID 6102 "Chest Finding or Feature Modifier" and CID 6104), ctpipe's code for a
#: part-solid nodule, which neither DCM nor a context group of PS3.16 names
COMPOSITIONS: dict[str, Code] = {
    "solid": Code("35702001", "SCT", "Solid"),
    "part_solid": private("part_solid", "Part-solid"),
    "ground_glass": Code("112120", "DCM", "Ground glass opacity"),
}
#: the values of :data:`COMPOSITION` in SRs of layouts 1-6 (all ctpipe's codes); read back, never written
COMPOSITIONS_EARLIER: dict[str, Code] = {
    "solid": private("solid", "Solid"),
    "ground_glass": private("ground_glass", "Ground glass"),
}
LUNG_COVERAGE = private("lung_coverage", "Lung coverage")
#: the contrast phase of the CT series (estimated from its HU): no standard code names it (DCM 109058 "Contrast Phase" is
#: a subpart of a cardiac catheterization procedure; PS3.16 lists no CT contrast phases), so ctpipe's own, as before
#: SR layout 3
CONTRAST_PHASE = private("contrast_phase", "Contrast phase")
#: read back from SRs of layout 3, which named the contrast phase so; never written (PS3.16 defines it as the subpart
#: of a cardiac catheterization procedure in which contrast medium is injected, not a CT acquisition's phase)
CONTRAST_PHASE_CATHETERIZATION = Code("109058", "DCM", "Contrast Phase")
#: the values of :data:`LUNG_COVERAGE` and :data:`AIRWAY_COVERAGE`: SNOMED CT's qualifier values Complete (CID 67),
#: Partial and Absent (CID 240)
COVERAGES: dict[str, Code] = {
    "complete": Code("255594003", "SCT", "Complete"),
    "partial": Code("255609007", "SCT", "Partial"),
    "absent": ABSENT,
}
#: the same in SRs of layouts 1-6 (ctpipe's codes); read back, never written
COVERAGES_EARLIER: dict[str, Code] = {v: private(v, v.capitalize()) for v in ("complete", "partial", "absent")}
#: whether the scan holds the airway (the trachea): "Airway coverage: Absent" for the flag airway_not_in_scan, a
#: property of the scan's range, not a deficiency of its images nor a finding about the patient
AIRWAY_COVERAGE = private("airway_coverage", "Airway coverage")
#: the quality flags that state a fact, not a deficiency of the images (no Quality Finding): the contrast phase flags
#: repeat :data:`CONTRAST_PHASE`'s value, one_lung is "Left lung: Absent" or "Right lung: Absent" (:data:`ABSENT`,
#: CID 240), airway_not_in_scan is :data:`AIRWAY_COVERAGE` Absent. SRs of layouts 1-4 stated them as Quality Findings.
INFORMATIONAL_FLAGS = ("contrast_arterial", "contrast_venous", "one_lung", "airway_not_in_scan")
#: the side without lung (one_lung's side) → the concept stated Absent
ABSENT_LUNGS: dict[str, Code] = {"left": LEFT_LUNG, "right": RIGHT_LUNG}
PHASES = {v: private(v, v.replace("_", " ").capitalize()) for v in ("non_contrast", "arterial", "venous")}


def quality_flag_code(code: str, sentence: str, *, side: str | None = None) -> Code:
    """The private code of quality flag ``code``; its meaning is the flag's fixed sentence (at most 64 characters).

    ``one_lung`` stated for the ``side`` with no lung has a code value of its own per side (``no_left_lung``,
    ``no_right_lung``), so that one code value always has one meaning; :func:`quality_flag_of` reads it back.
    """
    value = SIDED_FLAG_CODES.get((code, side or ""), code)
    return private(value, sentence[:64])


#: (flag, side) → the code value stating that flag for that side (a CodeValue holds at most 16 characters)
SIDED_FLAG_CODES: dict[tuple[str, str], str] = {
    ("one_lung", "left"): "no_left_lung",
    ("one_lung", "right"): "no_right_lung",
}


def quality_flag_of(value: str) -> str:
    """The quality flag a private code value of :func:`quality_flag_code` states (``no_left_lung`` → ``one_lung``)."""
    flags = {coded: flag for (flag, _), coded in SIDED_FLAG_CODES.items()}
    return flags.get(value, value)


#: organ name (as in :data:`pipeline.reconstruction.organs.ORGANS`) → (category, type) of its SEG segment
ORGAN_SEGMENTS: dict[str, tuple[Code, Code]] = {
    "body": (ANATOMICAL_STRUCTURE, ENTIRE_BODY),
    "lung_left": (ANATOMICAL_STRUCTURE, LUNG),
    "lung_right": (ANATOMICAL_STRUCTURE, LUNG),
    "airway": (ANATOMICAL_STRUCTURE, AIRWAY),
    "bone": (TISSUE, BONE),
}


#: organ name → the laterality modifying its SEG segment's type (SegmentedPropertyTypeModifierCodeSequence, CID 244):
#: CID 7151 "Segmentation Property Types" and CID 7155 "Thoracic Segmentation Types" list the Lung, not a left or
#: right lung, and the Segment Description macro states the side as the type's modifier
ORGAN_SEGMENT_LATERALITY: dict[str, Code] = {"lung_left": LATERALITY["left"], "lung_right": LATERALITY["right"]}
UPPER_LOBE = Code("45653009", "SCT", "Upper lobe of lung")
LOWER_LOBE = Code("90572001", "SCT", "Lower lobe of lung")
#: (side, lobe) → a nodule segment's anatomic region as CID 4 "Anatomic Region" and CID 7151 name it, and the
#: laterality modifying it (AnatomicRegionModifierSequence, CID 244; none for the middle lobe, the right lung's alone)
SEG_LOBES: dict[tuple[str, str], tuple[Code, Code | None]] = {
    ("left", "upper"): (UPPER_LOBE, LATERALITY["left"]),
    ("left", "lower"): (LOWER_LOBE, LATERALITY["left"]),
    ("right", "upper"): (UPPER_LOBE, LATERALITY["right"]),
    ("right", "middle"): (LOBES[("right", "middle")], None),
    ("right", "lower"): (LOWER_LOBE, LATERALITY["right"]),
}


def rgb255(hex_rgb: str) -> tuple[int, int, int]:
    """``#rrggbb`` as (R, G, B), 0-255."""
    r, g, b = (int(hex_rgb[i : i + 2], 16) for i in (1, 3, 5))
    return (r, g, b)


#: display colours (RGB 0-255) of the segments, for viewers that honour RecommendedDisplayCIELabValue: the colours of the
#: organs' outlines on ctpipe's PNGs (:data:`~pipeline.reconstruction.organs.OUTLINE_COLORS`: left lung blue, right lung
#: green, bone yellow, the body's edge white on the grey CT), so that a PACS shows each organ in the colour the PNGs' legends give it; nodules
#: magenta, as the renderings outline the segmented nodules (a bundle's vessels are red)
ORGAN_COLOURS: dict[str, tuple[int, int, int]] = {
    **{organ: rgb255(OUTLINE_COLORS[organ]) for organ in ("body", "lung_left", "lung_right", "airway", "bone")},
    "nodule": rgb255(OUTLINE_COLORS["nodules"]),
}
